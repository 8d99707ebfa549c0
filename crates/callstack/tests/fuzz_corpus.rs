//! Runs the fuzz targets' calls over the regression corpus in fuzz/corpus
//! on every `cargo test`: truncated ELF files, scrambled DWARF sections
//! (DWARF 4 and 5, compressed and not), malformed trace files. Any answer
//! or error is fine; a panic is not.
#![cfg(feature = "symbolize")]

use callstack::symbolize::{Address, Symbolizer};
use testsupport::workspace_root;

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = workspace_root().join("fuzz/corpus").join(name);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn symbolize_elf_corpus() {
    let files = corpus("symbolize_elf");
    assert!(files.len() >= 20);
    let mut opened = 0;
    let mut named = 0;
    for (name, data) in files {
        let Ok(mut s) = Symbolizer::for_bytes(data.clone()) else {
            continue;
        };
        opened += 1;
        for a in (0x1000..0x1400usize)
            .step_by(5)
            .chain((0x400000..0x400400).step_by(3))
        {
            if s.symbolize(Address::Exact(a)).function().is_some() {
                named += 1;
            }
        }
        for w in data.chunks_exact(8).take(64) {
            let a = u64::from_le_bytes(w.try_into().unwrap()) as usize;
            let _ = s.symbolize(Address::Return(a));
        }
        let _ = name;
    }
    // The intact files and most scrambled ones open and name something.
    assert!(opened >= 10, "{opened}");
    assert!(named > 0);
}

#[test]
fn tracefile_corpus() {
    let files = corpus("tracefile");
    let mut ok = 0;
    for (name, data) in files {
        if let Ok(t) = callstack::tracefile::read_all(&data[..]) {
            ok += 1;
            if name.ends_with("/valid") {
                assert_eq!(t.modules.len(), 1);
                assert_eq!(t.stacks.len(), 2);
                assert_eq!(t.stacks[1].tag, Some(42));
                assert!(t.stacks[0].first_is_exact);
            }
        }
    }
    assert!(ok >= 3);
}
