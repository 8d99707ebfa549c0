//! A fixed-size text buffer for the signal handler: no allocation, no
//! `core::fmt` (whose machinery is not promised to be allocation-free), only
//! bytes, decimal and hexadecimal numbers. Text past the end is dropped.

/// Text written into borrowed storage. Writes past the end are dropped and
/// remembered in [`Buf::truncated`].
pub(crate) struct Buf<'a> {
    bytes: &'a mut [u8],
    len: usize,
    truncated: bool,
}

impl<'a> Buf<'a> {
    /// An empty buffer over `bytes`.
    pub(crate) fn new(bytes: &'a mut [u8]) -> Self {
        Buf {
            bytes,
            len: 0,
            truncated: false,
        }
    }

    /// The text written so far.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// How many bytes are written.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Forgets everything after the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Whether some text did not fit.
    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    /// Appends raw bytes.
    pub(crate) fn bytes(&mut self, s: &[u8]) -> &mut Self {
        let room = self.bytes.len() - self.len;
        let n = s.len().min(room);
        self.bytes[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
        if n < s.len() {
            self.truncated = true;
        }
        self
    }

    /// Appends a string.
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.bytes(s.as_bytes())
    }

    /// Appends an unsigned decimal number.
    pub(crate) fn dec(&mut self, mut v: u64) -> &mut Self {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            i -= 1;
            tmp[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.bytes(&tmp[i..])
    }

    /// Appends a signed decimal number.
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) fn dec_i(&mut self, v: i64) -> &mut Self {
        if v < 0 {
            self.str("-");
        }
        self.dec(v.unsigned_abs())
    }

    /// Appends `0x` and `v` in lowercase hexadecimal, zero-padded to at
    /// least `width` digits.
    pub(crate) fn hex(&mut self, v: u64, width: usize) -> &mut Self {
        self.str("0x").hex_digits(v, width)
    }

    /// Appends `v` in lowercase hexadecimal without a prefix.
    pub(crate) fn hex_digits(&mut self, v: u64, width: usize) -> &mut Self {
        let mut tmp = [0u8; 16];
        let mut i = tmp.len();
        let mut x = v;
        loop {
            i -= 1;
            tmp[i] = HEX[(x & 0xf) as usize];
            x >>= 4;
            if x == 0 {
                break;
            }
        }
        let digits = tmp.len() - i;
        for _ in digits..width.min(16) {
            self.str("0");
        }
        self.bytes(&tmp[i..])
    }

    /// Appends each byte as two lowercase hex digits.
    #[cfg_attr(windows, allow(dead_code))]
    pub(crate) fn hex_bytes(&mut self, b: &[u8]) -> &mut Self {
        for &x in b {
            self.bytes(&[HEX[(x >> 4) as usize], HEX[(x & 0xf) as usize]]);
        }
        self
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::Buf;

    #[test]
    fn formats_numbers_and_truncates() {
        let mut storage = [0u8; 64];
        let mut b = Buf::new(&mut storage);
        b.str("a ")
            .dec(0)
            .str(" ")
            .dec(1234567890123)
            .str(" ")
            .dec_i(-5);
        b.str(" ").hex(0, 1).str(" ").hex(0xdeadbeef, 12).str(" ");
        b.hex_bytes(&[0x0f, 0xa0]);
        assert_eq!(
            b.as_bytes(),
            b"a 0 1234567890123 -5 0x0 0x0000deadbeef 0fa0"
        );
        let mut small = [0u8; 4];
        let mut b = Buf::new(&mut small);
        b.str("abcdef");
        assert_eq!(b.as_bytes(), b"abcd");
        assert!(b.truncated());
    }
}
