//! Section bytes of an ELF object, decompressed when the section is
//! compressed (`SHF_COMPRESSED`), with the declared size checked first.
//!
//! The compression header states the uncompressed size and `object`
//! reserves that much before inflating. A corrupt or hostile header can
//! claim hundreds of GiB for a few bytes of stream: [`plausible`] rejects a
//! size the stream could never expand to, before anything is allocated.

use object::{CompressedData, CompressionFormat, ObjectSection};
use std::borrow::Cow;

/// How many output bytes one input byte can at most become: deflate's
/// limit is about 1032:1; zstd's is about 32768:1 (an RLE block of 128 KiB
/// in 4 bytes). Rounded up, plus a little slack for tiny streams.
const ZLIB_RATIO: u64 = 1100;
const ZSTD_RATIO: u64 = 1 << 16;
const SLACK: u64 = 64 * 1024;

/// Whether `c` declares an uncompressed size its stream can produce.
pub(crate) fn plausible(c: &CompressedData<'_>) -> bool {
    let ratio = match c.format {
        CompressionFormat::None => return true,
        CompressionFormat::Zlib => ZLIB_RATIO,
        _ => ZSTD_RATIO,
    };
    let max = (c.data.len() as u64)
        .saturating_mul(ratio)
        .saturating_add(SLACK);
    c.uncompressed_size <= max && usize::try_from(c.uncompressed_size).is_ok()
}

/// The bytes of `s`, inflated if compressed; an error names a declared size
/// the stream cannot hold, or a stream that does not decompress.
pub(crate) fn data<'d>(s: &impl ObjectSection<'d>) -> Result<Cow<'d, [u8]>, String> {
    let c = s.compressed_data().map_err(|e| e.to_string())?;
    if !plausible(&c) {
        return Err(format!(
            "compressed section declares {} bytes, more than its {} bytes of stream can hold",
            c.uncompressed_size,
            c.data.len()
        ));
    }
    c.decompress().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_sizes_the_stream_cannot_hold() {
        let c = |format, len: usize, size| CompressedData {
            format,
            data: &[0u8; 64][..len],
            uncompressed_size: size,
        };
        assert!(plausible(&c(CompressionFormat::None, 64, 64)));
        assert!(plausible(&c(CompressionFormat::Zlib, 64, 64 * 1032)));
        assert!(!plausible(&c(CompressionFormat::Zlib, 20, 0x2e_0000_c960)));
        assert!(plausible(&c(CompressionFormat::Zstandard, 64, 64 * 32768)));
        assert!(!plausible(&c(CompressionFormat::Zstandard, 0, u64::MAX)));
    }
}
