//! Demangling of Rust (legacy and v0) and C++ (Itanium) names.

use std::borrow::Cow;

/// Demangles `name` if it is a Rust (legacy `_ZN..17h<hash>E` or v0 `_R`)
/// or C++ (`_Z`) symbol; returns it unchanged otherwise. Rust names come
/// without their hash (`std::rt::lang_start`), C++ names with their
/// parameters (`ns::f(int)`), as `addr2line -C` prints them.
///
/// ```
/// assert_eq!(callstack::symbolize::demangle("_ZN3foo3barE"), "foo::bar");
/// assert_eq!(callstack::symbolize::demangle("_Z3addii"), "add(int, int)");
/// assert_eq!(callstack::symbolize::demangle("main"), "main");
/// ```
pub fn demangle(name: &str) -> Cow<'_, str> {
    demangle_lang(name, None)
}

fn is_rust_legacy(name: &str) -> bool {
    // _ZN ... 17h<16 hex>E
    let b = name.as_bytes();
    b.len() > 23
        && name.starts_with("_ZN")
        && name.ends_with('E')
        && &b[b.len() - 20..b.len() - 17] == b"17h"
        && b[b.len() - 17..b.len() - 1]
            .iter()
            .all(u8::is_ascii_hexdigit)
}

fn rust(name: &str) -> Option<String> {
    rustc_demangle::try_demangle(name)
        .ok()
        .map(|d| format!("{d:#}"))
}

fn cpp(name: &str) -> Option<String> {
    let sym = cpp_demangle::Symbol::new(name).ok()?;
    sym.demangle().ok()
}

pub(crate) fn demangle_lang(name: &str, lang: Option<gimli::DwLang>) -> Cow<'_, str> {
    let out = match lang {
        Some(gimli::DW_LANG_Rust) => rust(name),
        Some(
            gimli::DW_LANG_C_plus_plus
            | gimli::DW_LANG_C_plus_plus_03
            | gimli::DW_LANG_C_plus_plus_11
            | gimli::DW_LANG_C_plus_plus_14
            | gimli::DW_LANG_C_plus_plus_17
            | gimli::DW_LANG_C_plus_plus_20,
        ) => cpp(name),
        _ if name.starts_with("_R") || is_rust_legacy(name) => rust(name),
        _ if name.starts_with("_Z") => cpp(name).or_else(|| rust(name)),
        _ => None,
    };
    match out {
        Some(s) => Cow::Owned(s),
        None => Cow::Borrowed(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_v0_and_cpp() {
        assert_eq!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE"),
            "std::rt::lang_start"
        );
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo"), "mycrate::foo");
        assert_eq!(demangle("_ZN2ns1fEi"), "ns::f(int)");
        assert_eq!(demangle("_Z"), "_Z");
        assert_eq!(demangle("_R!!"), "_R!!");
    }
}
