//! A pprof profile (`profile.proto`, gzipped or not) read back and checked
//! against the rules Parca's server applies before it ingests one
//! (`ValidatePprofProfile` in parca-dev/parca's `pkg/normalizer`): the
//! string table starts with "", mapping, function and location ids are
//! 1, 2, 3... in the order they are listed, every index into the string
//! table and every id a record names exists, each sample has a value per
//! sample type and non-zero location ids, each label a key. `go tool
//! pprof` is laxer (any ids), so a profile it reads may still be refused
//! by Parca; this is the check that it would not be.

use std::io::Read;

/// What a checked profile holds.
#[derive(Debug, Default)]
pub struct Pprof {
    /// The string table.
    pub strings: Vec<String>,
    /// (type, unit) of each sample type.
    pub sample_types: Vec<(String, String)>,
    /// Samples: (location ids, values).
    pub samples: Vec<(Vec<u64>, Vec<i64>)>,
    /// Mappings: (id, start, limit, file offset, file name, build-id).
    pub mappings: Vec<Mapping>,
    /// Locations: (id, mapping id, address).
    pub locations: Vec<(u64, u64, u64)>,
    /// Function ids.
    pub functions: Vec<u64>,
}

/// One mapping of a profile.
#[derive(Debug, Default, Clone)]
pub struct Mapping {
    pub id: u64,
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
    pub file: String,
    pub build_id: String,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.b.get(self.at).ok_or("a varint runs past the end")?;
            self.at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint of more than 10 bytes".into())
    }

    /// The next field: (number, wire type, varint value or bytes).
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.at >= self.b.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed
            }
            2 => {
                let n = self.varint()? as usize;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Field::Fixed
            }
            w => return Err(format!("wire type {w} of field {}", key >> 3)),
        };
        Ok(Some((key >> 3, value)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or("a field runs past the end")?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
}

enum Field<'a> {
    Varint(u64),
    Fixed,
    Bytes(&'a [u8]),
}

/// Every field of a message, in order.
fn fields(b: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut r = Reader { b, at: 0 };
    let mut out = Vec::new();
    while let Some(f) = r.field()? {
        out.push(f);
    }
    Ok(out)
}

fn varint_of(f: &Field<'_>) -> Result<u64, String> {
    match f {
        Field::Varint(v) => Ok(*v),
        _ => Err("a length-delimited field where a number was expected".into()),
    }
}

/// A repeated number, packed or not.
fn push_numbers(f: &Field<'_>, out: &mut Vec<u64>) -> Result<(), String> {
    match f {
        Field::Varint(v) => out.push(*v),
        Field::Bytes(b) => {
            let mut r = Reader { b, at: 0 };
            while r.at < b.len() {
                out.push(r.varint()?);
            }
        }
        Field::Fixed => return Err("a fixed-width field where a number was expected".into()),
    }
    Ok(())
}

fn bytes_of<'a>(f: &Field<'a>) -> Result<&'a [u8], String> {
    match f {
        Field::Bytes(b) => Ok(b),
        _ => Err("a number where a message was expected".into()),
    }
}

/// Reads `data` (a pprof profile, gzipped or not) and checks it by
/// Parca's rules (see the module documentation); the error says which
/// rule failed and where.
pub fn parca_check(data: &[u8]) -> Result<Pprof, String> {
    let mut raw = Vec::new();
    let data = if data.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut raw)
            .map_err(|e| format!("gzip: {e}"))?;
        &raw[..]
    } else {
        data
    };
    let mut p = Pprof::default();
    let mut sample_type_idx = Vec::new();
    let mut samples = Vec::new();
    let mut mapping_idx = Vec::new();
    let mut functions = Vec::new();
    let mut locations = Vec::new();
    let mut period_type = None;
    let mut default_sample_type = 0;
    for (n, f) in fields(data)? {
        match n {
            1 => {
                let (mut t, mut u) = (0, 0);
                for (k, v) in fields(bytes_of(&f)?)? {
                    match k {
                        1 => t = varint_of(&v)?,
                        2 => u = varint_of(&v)?,
                        _ => {}
                    }
                }
                sample_type_idx.push((t, u));
            }
            2 => samples.push(bytes_of(&f)?),
            3 => mapping_idx.push(bytes_of(&f)?),
            4 => locations.push(bytes_of(&f)?),
            5 => functions.push(bytes_of(&f)?),
            6 => p
                .strings
                .push(String::from_utf8(bytes_of(&f)?.to_vec()).map_err(|_| "a string not UTF-8")?),
            11 => period_type = Some(bytes_of(&f)?),
            14 => default_sample_type = varint_of(&f)?,
            _ => {}
        }
    }
    let strings = p.strings.len() as u64;
    if p.strings.first().is_some_and(|s| !s.is_empty()) {
        return Err(format!(
            "string table starts with {:?}, not \"\"",
            p.strings[0]
        ));
    }
    let string = |i: u64, what: &str| -> Result<String, String> {
        if i >= strings.max(1) {
            return Err(format!("{what}: string index {i} of {strings}"));
        }
        Ok(p.strings.get(i as usize).cloned().unwrap_or_default())
    };
    for (t, u) in &sample_type_idx {
        p.sample_types
            .push((string(*t, "sample type")?, string(*u, "sample unit")?));
    }
    if let Some(b) = period_type {
        for (_, v) in fields(b)? {
            string(varint_of(&v)?, "period type")?;
        }
    }
    string(default_sample_type, "default sample type")?;
    for (i, b) in mapping_idx.iter().enumerate() {
        let mut m = Mapping::default();
        for (k, v) in fields(b)? {
            match k {
                1 => m.id = varint_of(&v)?,
                2 => m.start = varint_of(&v)?,
                3 => m.limit = varint_of(&v)?,
                4 => m.offset = varint_of(&v)?,
                5 => m.file = string(varint_of(&v)?, "mapping file name")?,
                6 => m.build_id = string(varint_of(&v)?, "mapping build-id")?,
                _ => {}
            }
        }
        if m.id != i as u64 + 1 {
            return Err(format!(
                "mapping {} listed at {}: ids not 1, 2, 3...",
                m.id, i
            ));
        }
        p.mappings.push(m);
    }
    for (i, b) in functions.iter().enumerate() {
        let mut id = 0;
        for (k, v) in fields(b)? {
            match k {
                1 => id = varint_of(&v)?,
                2 => {
                    string(varint_of(&v)?, "function name")?;
                }
                3 => {
                    string(varint_of(&v)?, "function system name")?;
                }
                4 => {
                    string(varint_of(&v)?, "function file name")?;
                }
                _ => {}
            }
        }
        if id != i as u64 + 1 {
            return Err(format!("function {id} listed at {i}: ids not 1, 2, 3..."));
        }
        p.functions.push(id);
    }
    let (n_mappings, n_functions) = (p.mappings.len() as u64, p.functions.len() as u64);
    for (i, b) in locations.iter().enumerate() {
        let (mut id, mut mapping, mut address) = (0, 0, 0);
        for (k, v) in fields(b)? {
            match k {
                1 => id = varint_of(&v)?,
                2 => mapping = varint_of(&v)?,
                3 => address = varint_of(&v)?,
                4 => {
                    for (lk, lv) in fields(bytes_of(&v)?)? {
                        if lk == 1 && varint_of(&lv)? > n_functions {
                            return Err(format!(
                                "location {id}: function {} of {n_functions}",
                                varint_of(&lv)?
                            ));
                        }
                    }
                }
                _ => {}
            }
        }
        if id != i as u64 + 1 {
            return Err(format!("location {id} listed at {i}: ids not 1, 2, 3..."));
        }
        if mapping > n_mappings {
            return Err(format!("location {id}: mapping {mapping} of {n_mappings}"));
        }
        p.locations.push((id, mapping, address));
    }
    let n_locations = p.locations.len() as u64;
    if p.sample_types.is_empty() && !samples.is_empty() {
        return Err("samples but no sample type".into());
    }
    for (i, b) in samples.iter().enumerate() {
        let (mut locs, mut values) = (Vec::new(), Vec::new());
        for (k, v) in fields(b)? {
            match k {
                1 => push_numbers(&v, &mut locs)?,
                2 => push_numbers(&v, &mut values)?,
                3 => {
                    let (mut key, mut s) = (0, 0);
                    for (lk, lv) in fields(bytes_of(&v)?)? {
                        match lk {
                            1 => key = varint_of(&lv)?,
                            2 => s = varint_of(&lv)?,
                            _ => {}
                        }
                    }
                    if key == 0 {
                        return Err(format!("sample {i}: a label with no key"));
                    }
                    string(key, "label key")?;
                    string(s, "label value")?;
                }
                _ => {}
            }
        }
        if values.len() != p.sample_types.len() {
            return Err(format!(
                "sample {i}: {} values for {} sample types",
                values.len(),
                p.sample_types.len()
            ));
        }
        if let Some(l) = locs.iter().find(|&&l| l == 0 || l > n_locations) {
            return Err(format!("sample {i}: location {l} of {n_locations}"));
        }
        p.samples
            .push((locs, values.into_iter().map(|v| v as i64).collect()));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::parca_check;

    /// Hand-made messages: a good one, then each rule broken in turn.
    #[test]
    fn rules() {
        // string_table "", "cpu", "ns"; sample_type {1, 2}; mapping {id 1};
        // location {id 1, mapping 1}; sample {location 1, value 5}.
        let good: &[u8] = &[
            0x32, 0, 0x32, 3, b'c', b'p', b'u', 0x32, 2, b'n', b's', // strings
            0x0a, 4, 0x08, 1, 0x10, 2, // sample_type
            0x1a, 2, 0x08, 1, // mapping id 1
            0x22, 4, 0x08, 1, 0x10, 1, // location id 1, mapping 1
            0x12, 4, 0x08, 1, 0x10, 5, // sample
        ];
        let p = parca_check(good).unwrap();
        assert_eq!(p.sample_types, [("cpu".to_string(), "ns".to_string())]);
        assert_eq!(p.samples, [(vec![1], vec![5])]);
        // Mapping id 2 listed first.
        let mut bad = good.to_vec();
        bad[20] = 2;
        assert!(parca_check(&bad).unwrap_err().contains("mapping 2"));
        // A sample naming location 2 of 1.
        let mut bad = good.to_vec();
        bad[30] = 2;
        assert!(parca_check(&bad).unwrap_err().contains("location 2 of 1"));
        // A sample with two values for one type.
        let mut bad = good.to_vec();
        bad[28] = 6;
        bad.extend_from_slice(&[0x10, 6]);
        assert!(parca_check(&bad).unwrap_err().contains("2 values"));
        // A string table that does not start with "".
        assert!(parca_check(&good[2..]).unwrap_err().contains("not \"\""));
        // Cut short.
        assert!(parca_check(&good[..good.len() - 1]).is_err());
    }
}
