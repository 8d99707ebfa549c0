//! Demangling of Rust (legacy and v0) and C++ (Itanium, and MSVC's
//! decorated names) names.

use std::borrow::Cow;

/// Demangles `name` if it is a Rust (legacy `_ZN..17h<hash>E` or v0 `_R`)
/// or C++ (`_Z`, or with the `pdb` feature MSVC's `?f@ns@@YAHH@Z`) symbol;
/// returns it unchanged
/// otherwise. Rust names come without their hash (`std::rt::lang_start`),
/// C++ names with their parameters and without return type or access
/// (`ns::f(int)`), as `addr2line -C` prints them.
///
/// ```
/// assert_eq!(callstack::symbolize::demangle("_ZN3foo3barE"), "foo::bar");
/// assert_eq!(callstack::symbolize::demangle("_Z3addii"), "add(int, int)");
/// assert_eq!(callstack::symbolize::demangle("main"), "main");
/// ```
pub fn demangle(name: &str) -> Cow<'_, str> {
    demangle_lang(name, None)
}

/// `name` without an LTO suffix `.llvm.<hex digits>` (which LLVM appends
/// to a symbol it promotes to global when splitting a module).
fn without_llvm_suffix(name: &str) -> &str {
    match name.rfind(".llvm.") {
        Some(i)
            if i + 6 < name.len()
                && name[i + 6..]
                    .bytes()
                    .all(|c| c.is_ascii_hexdigit() || c == b'@') =>
        {
            &name[..i]
        }
        _ => name,
    }
}

fn is_rust_legacy(name: &str) -> bool {
    // _ZN ... 17h<16 hex>E, possibly with an LTO `.llvm.N` suffix (which
    // binutils and rustc-demangle drop).
    let name = without_llvm_suffix(name);
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
    if let Some(s) = rust_legacy_plain(name) {
        return Some(s);
    }
    rustc_demangle::try_demangle(name)
        .ok()
        .map(|d| format!("{d:#}"))
}

/// The common Rust legacy symbol (`_ZN`, length-prefixed ASCII
/// identifiers, a final `17h<hash>` element, `E` as the last byte)
/// demangled by our own loop: the same text rustc-demangle's alternate
/// form prints (the test below checks it on every symbol of the test
/// binary), at a fraction of the cost (a cold pass demangles thousands of
/// names; rustc-demangle's formatting machinery was 5% of it). `None`
/// for anything else (v0, a suffix, no hash, non-ASCII): rustc-demangle
/// handles those.
fn rust_legacy_plain(name: &str) -> Option<String> {
    let b = name.as_bytes();
    let inner = b.strip_prefix(b"_ZN")?;
    if !b.is_ascii() || b.last() != Some(&b'E') {
        return None;
    }
    // The elements: (start, len) of each identifier.
    let mut elements: [(usize, usize); 32] = [(0, 0); 32];
    let (mut n, mut i) = (0usize, 0usize);
    while inner.get(i) != Some(&b'E') {
        let d0 = i;
        let mut len = 0usize;
        while let Some(d) = inner.get(i).filter(|c| c.is_ascii_digit()) {
            len = len.checked_mul(10)?.checked_add((d - b'0') as usize)?;
            i += 1;
        }
        if i == d0 || n == elements.len() {
            return None;
        }
        elements[n] = (i, len);
        n += 1;
        i = i.checked_add(len)?;
        if i >= inner.len() {
            return None;
        }
    }
    // Nothing after the `E`, and the last element a hash (which also rules
    // out the `.llvm.` suffix rustc-demangle strips: it would have to be
    // followed by hex digits only).
    if i + 1 != inner.len() || n < 2 {
        return None;
    }
    let (hs, hl) = elements[n - 1];
    let hash = &inner[hs..hs + hl];
    if hash.first() != Some(&b'h') || !hash[1..].iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut out = String::with_capacity(b.len());
    for (k, &(s, l)) in elements[..n - 1].iter().enumerate() {
        if k != 0 {
            out.push_str("::");
        }
        // ASCII throughout: byte slices are str slices.
        let mut rest = &name[3 + s..3 + s + l];
        if rest.starts_with("_$") {
            rest = &rest[1..];
        }
        loop {
            if let Some(r) = rest.strip_prefix('.') {
                if let Some(r2) = r.strip_prefix('.') {
                    out.push_str("::");
                    rest = r2;
                } else {
                    out.push('.');
                    rest = r;
                }
            } else if let Some(r) = rest.strip_prefix('$') {
                let Some(end) = r.find('$') else { break };
                let (escape, after) = (&r[..end], &r[end + 1..]);
                let plain = match escape {
                    "SP" => '@',
                    "BP" => '*',
                    "RF" => '&',
                    "LT" => '<',
                    "GT" => '>',
                    "LP" => '(',
                    "RP" => ')',
                    "C" => ',',
                    _ => {
                        let c = escape.strip_prefix('u').and_then(|d| {
                            if !d.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                                return None;
                            }
                            u32::from_str_radix(d, 16).ok().and_then(char::from_u32)
                        });
                        match c {
                            Some(c) if !c.is_control() => c,
                            _ => break,
                        }
                    }
                };
                out.push(plain);
                rest = after;
            } else if let Some(i) = rest.find(['$', '.']) {
                out.push_str(&rest[..i]);
                rest = &rest[i..];
            } else {
                break;
            }
        }
        out.push_str(rest);
    }
    Some(out)
}

/// An MSVC-decorated name, spelled as [`cpp`] spells an Itanium one.
#[cfg(feature = "pdb")]
fn msvc(name: &str) -> Option<String> {
    use msvc_demangler::DemangleFlags as F;
    let flags = F::NO_ACCESS_SPECIFIERS
        | F::NO_FUNCTION_RETURNS
        | F::NO_MEMBER_TYPE
        | F::NO_MS_KEYWORDS
        | F::NO_THISTYPE
        | F::NO_CLASS_TYPE
        | F::SPACE_AFTER_COMMA;
    msvc_demangler::demangle(name, flags).ok()
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
        #[cfg(feature = "pdb")]
        _ if name.starts_with('?') => msvc(name),
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
        // MSVC's decorated names: with the `pdb` feature.
        #[cfg(feature = "pdb")]
        {
            assert_eq!(
                demangle("?run@Widget@shapes@@QEAAHH@Z"),
                "shapes::Widget::run(int)"
            );
            assert_eq!(
                demangle("??$twice@J@shapes@@YAJJ@Z"),
                "shapes::twice<long>(long)"
            );
        }
        #[cfg(not(feature = "pdb"))]
        assert_eq!(
            demangle("?run@Widget@shapes@@QEAAHH@Z"),
            "?run@Widget@shapes@@QEAAHH@Z"
        );
        assert_eq!(demangle("?"), "?");
        assert_eq!(demangle("_R!!"), "_R!!");
    }

    #[test]
    fn rust_legacy_with_an_lto_suffix() {
        // As `addr2line -C` (binutils 2.40) prints them.
        assert_eq!(
            demangle(
                "_ZN4core3ptr43drop_in_place$LT$regex_syntax..hir..Hir$GT$17h5f1e3c2b1a0d9e8fE.llvm.12345678901234567"
            ),
            "core::ptr::drop_in_place<regex_syntax::hir::Hir>"
        );
        assert_eq!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE.llvm.9"),
            "std::rt::lang_start"
        );
        // Not a suffix of hex digits: left to the C++ demangler's care.
        assert_ne!(
            demangle("_ZN3std2rt10lang_start17h0123456789abcdefE.llvm.x"),
            "std::rt::lang_start"
        );
    }

    fn reference(name: &str) -> Option<String> {
        rustc_demangle::try_demangle(name)
            .ok()
            .map(|d| format!("{d:#}"))
    }

    #[test]
    fn legacy_loop_prints_what_rustc_demangle_prints() {
        let h = "17h0123456789abcdefE";
        let cases = [
            format!("_ZN3std2rt10lang_start{h}"),
            format!("_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT${h}"),
            format!("_ZN5alloc3vec12Vec$LT$T$C$A$GT$4push{h}"),
            format!("_ZN3foo13_$LT$impl$GT$3bar{h}"),
            format!("_ZN3foo3a.b3c..{h}"),
            format!("_ZN3foo7$SP$$BP$$RF${h}"),
            format!("_ZN3foo6$u20$x$u7e${h}"),
            format!("_ZN3foo5$u0a$x{h}"),
            format!("_ZN3foo4$XY${h}"),
            format!("_ZN3foo5$u7E$x{h}"),
            format!("_ZN3foo3$u${h}"),
            format!("_ZN3foo4a$bc{h}"),
            format!("_ZN3foo0{h}"),
            "_ZN3foo3barE".into(),
            "_ZN3foo3bar17h0123E".into(),
            "_ZN3foo3bar17h0123456789abcdefE.llvm.1234".into(),
            "_ZN3foo3bar17h01234567.llvm.9ABE".into(),
            "_ZN3fo".into(),
            "_ZN99fooE".into(),
            "_ZN3fooE".into(),
            "_ZNE".into(),
            "_ZN3f\u{e9}o3bar17h0123456789abcdefE".into(),
        ];
        for c in &cases {
            if let Some(ours) = rust_legacy_plain(c) {
                assert_eq!(Some(ours), reference(c), "{c}");
            }
            assert_eq!(rust(c), reference(c), "{c}");
        }
        // Every legacy symbol of this test binary.
        use object::{Object, ObjectSymbol};
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&*data).unwrap();
        let mut fast = 0;
        for sym in obj.symbols() {
            let Ok(name) = sym.name() else { continue };
            if let Some(ours) = rust_legacy_plain(name) {
                assert_eq!(Some(ours), reference(name), "{name}");
                fast += 1;
            }
        }
        assert!(fast > 100, "{fast} legacy symbols");
    }
}
