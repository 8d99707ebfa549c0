//! What the CLI does not say: nothing on a closed pipe (`callstack ... |
//! head` ends quietly, as `cat` does), and no warning about files mapped by
//! every ordinary process (locale archives, the gconv cache: not ELF, no
//! code, nothing to name).

use std::io::Read;
use std::process::{Command, Stdio};
use testsupport::release_artifacts;

#[test]
fn closed_pipe_ends_quietly() {
    let cli = &release_artifacts().cli;
    // Far more output than a pipe holds: the writes after the reader has
    // gone fail.
    let addrs: Vec<String> = (0..200_000u64).map(|a| format!("{:#x}", 0x1000 + a)).collect();
    let input = testsupport::scratch_dir("quiet-pipe").join("addrs");
    std::fs::write(&input, addrs.join("\n") + "\n").unwrap();
    let mut child = Command::new(cli)
        .args(["addr2line", "-a", "-f", "-e"])
        .arg(cli)
        .stdin(std::fs::File::open(&input).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 18];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert_eq!(&first, b"0x0000000000001000");
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(err, "", "{status}");
    use std::os::unix::process::ExitStatusExt;
    // Ended by SIGPIPE (a shell shows no message for it), or exit 0.
    assert!(
        status.signal() == Some(libc::SIGPIPE) || status.success(),
        "{status}"
    );
}

#[test]
fn no_warnings_about_mapped_locale_files() {
    use std::io::BufRead;
    let dir = testsupport::scratch_dir("quiet-locale");
    // bash with a UTF-8 locale maps LC_CTYPE and the gconv cache; it then
    // blocks in read(2) on its standard input.
    let mut child = Command::new("bash")
        .args(["-c", "echo ready; read x"])
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid = child.id();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let data_files = maps
        .lines()
        .filter(|l| l.contains("/locale/") || l.contains("gconv"))
        .count();
    let cli = &release_artifacts().cli;
    let live = Command::new(cli)
        .args(["pstack", &pid.to_string()])
        .output()
        .unwrap();
    let prefix = dir.join("core");
    let g = Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(pid.to_string())
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let core = format!("{}.{pid}", prefix.display());
    let from_core = Command::new(cli)
        .arg("core")
        .arg(&exe)
        .arg(&core)
        .output()
        .unwrap();
    for (what, o) in [("pstack", &live), ("core", &from_core)] {
        assert!(o.status.success(), "{what}");
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            "",
            "{what} warned ({data_files} locale/gconv mappings)"
        );
        assert!(String::from_utf8_lossy(&o.stdout).contains("read"), "{what}");
    }
}
