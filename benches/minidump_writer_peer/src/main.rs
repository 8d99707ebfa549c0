//! `minidump-writer-peer PID OUT`: writes a minidump of live process PID
//! (all its threads, stopped with ptrace while copied, then left running)
//! with the minidump-writer crate, the way a crash reporter using that
//! crate does from its monitor process.
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: minidump-writer-peer PID OUT");
        std::process::exit(2);
    }
    let pid: i32 = args[1].parse().expect("PID");
    let mut f = std::fs::File::create(&args[2]).expect("create OUT");
    let mut w = minidump_writer::minidump_writer::MinidumpWriter::new(pid, pid);
    if let Err(e) = w.dump(&mut f) {
        eprintln!("minidump-writer-peer: {e}");
        std::process::exit(1);
    }
}
