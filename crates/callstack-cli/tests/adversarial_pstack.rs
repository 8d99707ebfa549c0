//! `callstack pstack` against targets that misbehave while being looked at
//! (`tests/fixtures/c/adv_target.c`): they exit, are killed, are stopped
//! (and killed while stopped), or lose their leader. Every run ends within a
//! deadline (a hang fails the test), with either the threads or a clear
//! message, never a panic.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use testsupport::{release_artifacts, scratch_dir, Gcc};

/// A pstack run longer than this is a hang.
const DEADLINE: Duration = Duration::from_secs(20);

fn target() -> PathBuf {
    let dir = scratch_dir("adversarial-pstack");
    Gcc::new(&["adv_target.c"])
        .flags("-O1 -fno-omit-frame-pointer -pthread")
        .build(&dir.join("adv_target"))
}

/// Starts the target and waits for its "ready" line.
fn start(exe: &PathBuf, args: &[&str]) -> Child {
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the target");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready"), "target said {line:?}");
    child
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill on our own child's pid (not reaped yet, so not reused).
    unsafe { libc::kill(pid as i32, sig) };
}

/// Starts `callstack pstack PID`.
fn spawn_pstack(pid: u32) -> Child {
    Command::new(&release_artifacts().cli)
        .args(["pstack", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run callstack pstack")
}

/// Waits for pstack within [`DEADLINE`]; a hang kills it and fails.
fn finish(mut p: Child, what: &str) -> (Output, String, String) {
    let t = Instant::now();
    loop {
        if p.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > DEADLINE {
            let _ = p.kill();
            let _ = p.wait();
            panic!("callstack pstack hung ({what})");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = p.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "pstack panicked ({what}): {stderr}"
    );
    (o, stdout, stderr)
}

/// Threads, or a clear message saying the target is gone.
fn check_outcome(what: &str, (o, stdout, stderr): &(Output, String, String)) -> bool {
    if o.status.success() {
        assert!(
            stdout.contains("Thread "),
            "{what}: no thread shown:\n{stdout}\n{stderr}"
        );
        return true;
    }
    let clear = [
        "no process with id",
        "is a zombie",
        "exited (or was killed) while its threads were being stopped",
    ];
    assert!(
        clear.iter().any(|m| stderr.contains(m)),
        "{what}: unclear failure: {stderr}"
    );
    false
}

#[test]
fn a_zombie_leader_with_a_live_thread_shows_the_live_thread() {
    let exe = target();
    let mut child = start(&exe, &["zombie-leader"]);
    let pid = child.id();
    // Wait for the leader to have exited (its state Z), the thread alive.
    let t = Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if stat
            .rsplit_once(')')
            .unwrap()
            .1
            .trim_start()
            .starts_with('Z')
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the leader never exited"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = finish(spawn_pstack(pid), "zombie leader");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(out.0.status.success(), "pstack failed: {}", out.2);
    assert!(out.1.contains("live_worker"), "{}", out.1);
    // Only the live thread: the leader has no stack.
    assert_eq!(out.1.matches("Thread ").count(), 1, "{}", out.1);
}

#[test]
fn pstack_never_hangs_on_targets_that_exit_are_killed_or_stopped() {
    let exe = target();
    let _ = release_artifacts();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut shown, mut gone) = (0, 0);
    let t0 = Instant::now();
    let mut runs = 0;
    // Many runs, bounded in time.
    while runs < 80 && t0.elapsed() < Duration::from_secs(30) {
        let kind = runs % 4;
        runs += 1;
        let delay = Duration::from_micros(rand(8000));
        let out = match kind {
            // Exits by itself soon after pstack starts.
            0 => {
                let ms = rand(20).to_string();
                let mut child = start(&exe, &["exit", "4", &ms]);
                let p = spawn_pstack(child.id());
                let out = finish(p, "target exiting");
                child.wait().unwrap();
                out
            }
            // Killed while pstack runs (stays a zombie until pstack ends).
            1 => {
                let mut child = start(&exe, &["threads", "4"]);
                let p = spawn_pstack(child.id());
                std::thread::sleep(delay);
                signal(child.id(), libc::SIGKILL);
                let out = finish(p, "target killed");
                child.wait().unwrap();
                out
            }
            // Stopped, then killed while stopped, while pstack runs.
            2 => {
                let mut child = start(&exe, &["threads", "4"]);
                signal(child.id(), libc::SIGSTOP);
                let p = spawn_pstack(child.id());
                std::thread::sleep(delay);
                signal(child.id(), libc::SIGKILL);
                let out = finish(p, "stopped target killed");
                child.wait().unwrap();
                out
            }
            // Stopped mid-run: the threads are shown, the target goes on.
            _ => {
                let mut child = start(&exe, &["threads", "4"]);
                signal(child.id(), libc::SIGSTOP);
                let out = finish(spawn_pstack(child.id()), "stopped target");
                assert!(out.0.status.success(), "stopped target: {}", out.2);
                signal(child.id(), libc::SIGCONT);
                child.kill().unwrap();
                child.wait().unwrap();
                out
            }
        };
        if check_outcome(&format!("run {runs} (kind {kind})"), &out) {
            shown += 1;
        } else {
            gone += 1;
        }
    }
    eprintln!("{runs} runs: {shown} showed threads, {gone} found the target gone");
    assert!(runs >= 20, "{runs} runs");
}
