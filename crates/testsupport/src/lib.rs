//! Helpers shared by the tests of every callstack crate.
//!
//! - [`release_artifacts`]: builds (once per test process) and locates
//!   `libcallstack.a`, `libcallstack.so`, the header and the `callstack` binary.
//! - [`Gcc`]: compiles C fixtures from `tests/fixtures/` into a scratch dir.
//! - [`gdb_backtrace`] and [`addr2line_functions`]: the oracles.

pub mod alloc;
pub mod crash;
pub mod insn_lib;
pub mod pprof;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root (the directory with the top `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The C fixtures directory, `tests/fixtures/c` at the workspace root.
pub fn c_fixtures() -> PathBuf {
    workspace_root().join("tests/fixtures/c")
}

/// Paths of the release artifacts the tests link to or run.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `target/release/libcallstack.a`
    pub static_lib: PathBuf,
    /// `target/release/libcallstack.so`
    pub shared_lib: PathBuf,
    /// `crates/callstack-capi/include`
    pub include_dir: PathBuf,
    /// `target/release/callstack`
    pub cli: PathBuf,
    /// `target/release/libcallstack_preload.so` (`callstack memtrack`'s library)
    pub preload_lib: PathBuf,
    /// The Rust program that crashes on purpose
    /// (`tests/fixtures/rust/crash_fixture`): `target/release/crash_fixture`
    /// copied to `target/test-scratch/crash-fixture/`, where no `callstack`
    /// binary sits next to it, so that it symbolizes its own crashes
    /// (re-executed) unless a test names a helper.
    pub crash_fixture: PathBuf,
}

/// The packages [`release_artifacts`] builds, in one cargo command.
/// `scripts/test.sh` builds the same list up front: one command, so one
/// set of unified features and one release build of `callstack` for all
/// of them, which the tests' own command then finds fresh.
pub const RELEASE_PACKAGES: [&str; 4] = [
    "callstack-capi",
    "callstack-cli",
    "callstack-preload",
    "crash_fixture",
];

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `target/` of the
/// workspace.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => workspace_root().join("target"),
    }
}

/// The target triple a qemu-user stage built this test for
/// (`CALLSTACK_TEST_TARGET`, set by `scripts/test-<arch>.sh`), or `None`
/// on the host. Executables the test builds for its own architecture are
/// then built with `--target` and run through [`target_command`].
pub fn cross_target() -> Option<String> {
    std::env::var("CALLSTACK_TEST_TARGET")
        .ok()
        .filter(|t| !t.is_empty())
}

/// A command that runs `exe`, an executable of the test's own target: the
/// executable itself on the host; under a qemu-user stage, cargo's runner
/// for that target (`CARGO_TARGET_<TRIPLE>_RUNNER`, `qemu-riscv64 -L
/// /usr/riscv64-linux-gnu`) with `exe` as its argument, since qemu-user
/// without binfmt_misc cannot start a guest executable directly.
pub fn target_command(exe: &Path) -> Command {
    let runner = cross_target().and_then(|t| {
        let var = format!(
            "CARGO_TARGET_{}_RUNNER",
            t.to_uppercase().replace(['-', '.'], "_")
        );
        std::env::var(var).ok()
    });
    let words: Vec<String> = runner
        .as_deref()
        .unwrap_or("")
        .split_whitespace()
        .map(String::from)
        .collect();
    match words.split_first() {
        Some((prog, args)) => {
            let mut cmd = Command::new(prog);
            cmd.args(args).arg(exe);
            cmd
        }
        None => Command::new(exe),
    }
}

/// A `cargo` command (`$CARGO`, else `cargo` on `PATH`) without the
/// variables cargo sets for the test that runs it (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*`, ...). Some build scripts watch them (ring's reads
/// `CARGO_MANIFEST_DIR`): left in, a nested build's fingerprints differ
/// from those of the same build started from a shell, and each rebuilds
/// what the other built, `callstack` and the CLI included.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let set_for_the_test = k.starts_with("CARGO_PKG_")
            || matches!(
                k,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "OUT_DIR"
            );
        if set_for_the_test {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Builds the C library, the CLI, the preload library and the Rust crash
/// fixture in release mode ([`RELEASE_PACKAGES`]; once per process, and
/// cheaply when already built) and returns where they are.
pub fn release_artifacts() -> &'static Artifacts {
    static ART: OnceLock<Artifacts> = OnceLock::new();
    ART.get_or_init(|| {
        let mut cmd = cargo();
        cmd.current_dir(workspace_root())
            .args(["build", "--release", "-q"]);
        for p in RELEASE_PACKAGES {
            cmd.args(["-p", p]);
        }
        let status = cmd.status().expect("run cargo build --release");
        assert!(
            status.success(),
            "cargo build --release of the C API and CLI failed"
        );
        let rel = target_dir().join("release");
        let crash_fixture = scratch_dir("crash-fixture").join("crash_fixture");
        let part = crash_fixture.with_extension("part");
        std::fs::copy(rel.join("crash_fixture"), &part).expect("copy the crash fixture");
        std::fs::rename(&part, &crash_fixture).expect("move the crash fixture in place");
        Artifacts {
            static_lib: rel.join("libcallstack.a"),
            shared_lib: rel.join("libcallstack.so"),
            include_dir: workspace_root().join("crates/callstack-capi/include"),
            cli: rel.join("callstack"),
            preload_lib: rel.join("libcallstack_preload.so"),
            crash_fixture,
        }
    })
}

/// A fresh scratch directory under the target dir, named after `tag`.
///
/// The directories a test process made are removed when it exits, unless
/// one of its tests panicked (they are then kept to look into) or
/// `CALLSTACK_KEEP_SCRATCH` is set: a whole run of the suite leaves
/// gigabytes of fixtures, cores and copies otherwise.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let d = target_dir()
        .join("test-scratch")
        .join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    scratch::track(&d);
    d
}

/// Removal of the scratch directories at exit ([`scratch_dir`]).
mod scratch {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, Once};

    /// The directories made by this process, and the pid that made them.
    static MADE: Mutex<Vec<(u32, PathBuf)>> = Mutex::new(Vec::new());
    /// Set by the panic hook: a test failed, so its files are kept.
    static PANICKED: AtomicBool = AtomicBool::new(false);

    pub(super) fn track(d: &Path) {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                PANICKED.store(true, Ordering::Relaxed);
                previous(info)
            }));
            // SAFETY: `remove_at_exit` is an `extern "C" fn()` that
            // unwinds nowhere (it catches nothing and cannot panic: every
            // step ignores its error).
            unsafe { libc::atexit(remove_at_exit) };
        });
        if let Ok(mut made) = MADE.lock() {
            let entry = (std::process::id(), d.to_path_buf());
            if !made.contains(&entry) {
                made.push(entry);
            }
        }
    }

    extern "C" fn remove_at_exit() {
        if PANICKED.load(Ordering::Relaxed) || std::env::var_os("CALLSTACK_KEEP_SCRATCH").is_some()
        {
            return;
        }
        // A forked child that exits through `exit` runs this too: it
        // removes only what its own pid made.
        let me = std::process::id();
        let Ok(made) = MADE.try_lock() else { return };
        for (pid, d) in made.iter() {
            if *pid == me {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
}

/// A gcc invocation for a C fixture.
#[derive(Debug, Clone)]
pub struct Gcc {
    sources: Vec<PathBuf>,
    flags: Vec<String>,
    link_callstack: bool,
}

impl Gcc {
    /// Starts a build of `sources` (paths relative to `tests/fixtures/c`, or absolute).
    pub fn new(sources: &[&str]) -> Self {
        let dir = c_fixtures();
        Gcc {
            sources: sources.iter().map(|s| dir.join(s)).collect(),
            flags: vec!["-g".into()],
            link_callstack: false,
        }
    }

    /// Adds compiler flags, split on whitespace (`"-O2 -fno-omit-frame-pointer"`).
    pub fn flags(mut self, flags: &str) -> Self {
        self.flags
            .extend(flags.split_whitespace().map(String::from));
        self
    }

    /// Links `libcallstack.a` (and adds its include dir).
    pub fn link_callstack(mut self) -> Self {
        self.link_callstack = true;
        self
    }

    /// Compiles into `out` and returns its path. Panics with gcc's stderr on failure.
    ///
    /// gcc writes a file beside `out` that is then renamed over it, so tests
    /// running in parallel that build the same `out` never see (run, debug,
    /// symbolize) a half-written executable.
    pub fn build(&self, out: &Path) -> PathBuf {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp = out.as_os_str().to_owned();
        tmp.push(format!(".tmp{}-{seq}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        // `CALLSTACK_TEST_CC`: a cross compiler, when the tests themselves
        // run under qemu-user (scripts/test-aarch64.sh).
        let cc = std::env::var("CALLSTACK_TEST_CC").unwrap_or_else(|_| "gcc".into());
        let mut cmd = Command::new(cc);
        cmd.args(&self.flags)
            .args(&self.sources)
            .arg("-o")
            .arg(&tmp);
        if self.link_callstack {
            let a = release_artifacts();
            cmd.arg("-I").arg(&a.include_dir).arg(&a.static_lib);
            cmd.args(["-lpthread", "-ldl", "-lm"]);
        }
        let o = cmd.output().expect("run gcc");
        assert!(
            o.status.success(),
            "gcc failed: {:?}\n{}",
            cmd,
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::rename(&tmp, out).expect("rename the built executable into place");
        out.to_path_buf()
    }
}

/// gdb's arguments for a batch run: no init files, no pager, no
/// debuginfod lookups.
pub const GDB_BATCH_ARGS: [&str; 6] = [
    "-nx",
    "-batch",
    "-ex",
    "set pagination off",
    "-ex",
    "set debuginfod enabled off",
];

/// `program` (gdb or gdb-multiarch) with [`GDB_BATCH_ARGS`].
pub fn gdb_batch(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(GDB_BATCH_ARGS);
    cmd
}

/// Function names of gdb's `bt` at a breakpoint on `break_at` (a function
/// name or `file:line`), innermost first, running `exe` with `args`.
pub fn gdb_backtrace(exe: &Path, break_at: &str, args: &[&str]) -> Vec<String> {
    let o = gdb_batch("gdb")
        .args(["-ex", &format!("break {break_at}"), "-ex"])
        .arg(format!("run {}", args.join(" ")))
        .args(["-ex", "bt"])
        .arg(exe)
        .output()
        .expect("run gdb");
    parse_gdb_bt(&String::from_utf8_lossy(&o.stdout))
}

/// The pc of every frame of every thread of a core, as gdb prints them with
/// `frame apply all -q p/x $pc`, innermost first, nothing folded.
///
/// `debugger` is the command line that runs gdb: `&["gdb"]`,
/// `&["gdb-multiarch"]` for a foreign core, or `&["timeout", "60",
/// "gdb-multiarch"]` to bound a gdb that may hang (what it printed before
/// being stopped is used).
pub fn gdb_core_pcs(debugger: &[&str], exe: &Path, core: &Path) -> Vec<u64> {
    let o = Command::new(debugger[0])
        .args(&debugger[1..])
        .args(GDB_BATCH_ARGS)
        .args([
            "-ex",
            "set backtrace limit 100",
            "-ex",
            "frame apply all -q p/x $pc",
        ])
        .arg(exe)
        .arg(core)
        .output()
        .unwrap_or_else(|e| panic!("run {debugger:?}: {e}"));
    parse_gdb_pcs(&String::from_utf8_lossy(&o.stdout))
}

/// The pcs of gdb's `p/x $pc` lines (`$N = 0x...`), in order.
pub fn parse_gdb_pcs(text: &str) -> Vec<u64> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('$'))
        .filter_map(|l| l.split(" = ").nth(1))
        .filter_map(|a| a.trim().strip_prefix("0x"))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .collect()
}

/// `pcs` with consecutive repeats folded: gdb gives each inlined frame the
/// pc of the physical frame that holds it.
pub fn fold_repeats(mut pcs: Vec<u64>) -> Vec<u64> {
    pcs.dedup();
    pcs
}

/// Extracts the function names from gdb `bt` output lines (`#N  0x... in f (...) at ...`).
pub fn parse_gdb_bt(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        if !l.starts_with('#') {
            continue;
        }
        let rest = l
            .split_once(char::is_whitespace)
            .map(|x| x.1)
            .unwrap_or("")
            .trim_start();
        let rest = match rest.split_once(" in ") {
            Some((addr, r)) if addr.starts_with("0x") => r,
            _ => rest,
        };
        let name = rest.split([' ', '(']).next().unwrap_or("").to_string();
        out.push(name);
    }
    out
}

/// Runs `exe` with `args` under `gdb -batch`, executing `commands` in order
/// (e.g. `["set backtrace past-main on", "break d", "run", "bt", "continue"]`),
/// and returns everything gdb and the program printed on stdout. gdb disables
/// ASLR, so addresses the program prints match the ones gdb shows.
pub fn gdb_run(exe: &Path, args: &[&str], commands: &[&str]) -> String {
    let mut cmd = gdb_batch("gdb");
    for c in commands {
        let c = if *c == "run" {
            format!("run {}", args.join(" "))
        } else {
            c.to_string()
        };
        cmd.arg("-ex").arg(c);
    }
    let o = cmd.arg(exe).output().expect("run gdb");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One frame of gdb's `bt`: its pc when gdb prints one (every frame but a
/// frame #0 stopped at the start of a line) and its function name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdbFrame {
    /// The `0x...` address gdb printed for the frame (for frames above #0,
    /// the return address into that function).
    pub pc: Option<u64>,
    /// The function name.
    pub function: String,
}

/// Parses gdb `bt` output lines into frames with their pc and function.
pub fn parse_gdb_bt_frames(text: &str) -> Vec<GdbFrame> {
    let mut out = Vec::new();
    for line in text.lines() {
        let l = line.trim_start();
        if !l.starts_with('#') || !l[1..].starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let rest = l
            .split_once(char::is_whitespace)
            .map(|x| x.1)
            .unwrap_or("")
            .trim_start();
        let (pc, rest) = match rest.split_once(" in ") {
            Some((addr, r)) if addr.starts_with("0x") => {
                (u64::from_str_radix(&addr[2..], 16).ok(), r)
            }
            _ => (None, rest),
        };
        let function = rest.split([' ', '(']).next().unwrap_or("").to_string();
        out.push(GdbFrame { pc, function });
    }
    out
}

/// Function names (`addr2line -f -C -e exe`) of module-relative addresses.
/// For return addresses pass `ra - 1`.
pub fn addr2line_functions(exe: &Path, offsets: &[u64]) -> Vec<String> {
    if offsets.is_empty() {
        return Vec::new();
    }
    let o = Command::new("addr2line")
        .arg("-f")
        .arg("-C")
        .arg("-e")
        .arg(exe)
        .args(offsets.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("run addr2line");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .step_by(2)
        .map(|s| s.to_string())
        .collect()
}

/// For each module-relative address, the inlined call chain at it
/// (`addr2line -f -i -C -a`), innermost first: the last name is the function
/// whose frame holds the address (the one a frame-pointer walk sees), the
/// first is what plain `addr2line -f` prints. For return addresses pass `ra - 1`.
pub fn addr2line_inlined(exe: &Path, offsets: &[u64]) -> Vec<Vec<String>> {
    if offsets.is_empty() {
        return Vec::new();
    }
    let o = Command::new("addr2line")
        .args(["-f", "-i", "-C", "-a", "-e"])
        .arg(exe)
        .args(offsets.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("run addr2line");
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("0x") {
            out.push(Vec::new());
        } else if let Some(cur) = out.last_mut() {
            // A function name, then its file:line.
            cur.push(l.to_string());
            lines.next();
        }
    }
    out
}

/// Splits an `strace -f` log at its `getppid()` markers (calls a test
/// program makes between the parts it wants to check): section 0 is what
/// came before the first marker, section `i` what followed marker `i`.
/// A section keeps only the calls of the thread that made its opening
/// marker; other threads' calls interleave in the log but are not counted.
pub fn strace_sections(log: &str) -> Vec<Vec<String>> {
    let mut sections: Vec<Vec<String>> = vec![vec![]];
    let mut owner: Option<&str> = None;
    for line in log.lines() {
        let (pid, call) = line
            .split_once(' ')
            .map(|(p, c)| (p, c.trim_start()))
            .unwrap_or(("", line));
        if call.starts_with("getppid(") {
            sections.push(vec![]);
            owner = Some(pid);
        } else if owner.is_none_or(|o| o == pid) {
            sections.last_mut().unwrap().push(call.to_string());
        }
    }
    sections
}

/// A core of live process `pid` written by gdb's `gcore` into `dir`
/// (`dir/core.PID`); panics with gcore's words if none was written.
pub fn gcore(pid: u32, dir: &Path) -> PathBuf {
    let prefix = dir.join("core");
    let o = Command::new("gcore")
        .arg("-o")
        .arg(&prefix)
        .arg(pid.to_string())
        .output()
        .expect("run gcore");
    let core = PathBuf::from(format!("{}.{pid}", prefix.display()));
    assert!(
        core.is_file(),
        "gcore wrote no core: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    core
}

/// `minidump-stackwalk --json --use-local-debuginfo DUMP`'s output (the
/// JSON text), run in `dir` when given (where it finds the modules' files
/// by their relative names); a panic that names the dump and shows the
/// tool's errors when it fails.
pub fn stackwalk_json_text(dump: &Path, dir: Option<&Path>) -> Vec<u8> {
    let mut cmd = Command::new(minidump_stackwalk());
    cmd.args(["--json", "--use-local-debuginfo"]).arg(dump);
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let o = cmd
        .output()
        .expect("run minidump-stackwalk (scripts/install-test-deps.sh installs it)");
    assert!(
        o.status.success(),
        "minidump-stackwalk failed on {}:\n{}",
        dump.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// rust-minidump's `minidump-stackwalk`, the oracle of the minidump tests:
/// `$MINIDUMP_STACKWALK`, else on `PATH`, else where
/// scripts/install-test-deps.sh installs it (`$CALLSTACK_TOOLS/bin`, by
/// default `~/.local/share/callstack-tools/bin`). Panics, naming the
/// script, when it is nowhere: an oracle that is missing must not turn a
/// test into a silent pass.
pub fn minidump_stackwalk() -> PathBuf {
    if let Some(p) = std::env::var_os("MINIDUMP_STACKWALK") {
        return p.into();
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(t) = std::env::var_os("CALLSTACK_TOOLS") {
        dirs.push(PathBuf::from(t).join("bin"));
    }
    dirs.push(home.join(".local/share/callstack-tools/bin"));
    dirs.into_iter()
        .map(|d| d.join("minidump-stackwalk"))
        .find(|p| p.is_file())
        .expect("minidump-stackwalk not found: run scripts/install-test-deps.sh")
}

/// google/pprof's own command (not `go tool pprof`): the same driver, but
/// symbolizing through binutils (`addr2line`, `nm`, `objdump`) as a
/// profile server does for C, C++ and Rust programs, where `go tool
/// pprof` only reads Go binaries' tables. Built once per process, offline,
/// from the copy of google/pprof that Go's own sources vendor
/// (`$GOROOT/src/cmd/vendor`), into the target dir. `None` (said on
/// stderr) when `go` is not installed.
pub fn pprof_with_binutils() -> Option<PathBuf> {
    static PPROF: OnceLock<Option<PathBuf>> = OnceLock::new();
    PPROF
        .get_or_init(|| {
            let goroot = match Command::new("go").args(["env", "GOROOT"]).output() {
                Ok(o) if o.status.success() => {
                    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
                }
                _ => {
                    eprintln!("no go: google/pprof's command cannot be built");
                    return None;
                }
            };
            let vendor = goroot.join("src/cmd/vendor/github.com");
            let dir = target_dir().join("pprof-binutils");
            let exe = dir.join("bin/pprof");
            if exe.is_file() {
                return Some(exe);
            }
            let _ = std::fs::remove_dir_all(&dir);
            let copy = |from: &str, to: &str, module: &str| {
                let status = Command::new("cp")
                    .arg("-r")
                    .arg(vendor.join(from))
                    .arg(dir.join(to))
                    .status()
                    .expect("run cp");
                assert!(status.success(), "copying {from} from {vendor:?}");
                std::fs::write(dir.join(to).join("go.mod"), module).unwrap();
            };
            std::fs::create_dir_all(dir.join("main")).unwrap();
            copy(
                "google/pprof",
                "pprof",
                "module github.com/google/pprof\ngo 1.17\nrequire github.com/ianlancetaylor/demangle v0.0.0\nreplace github.com/ianlancetaylor/demangle => ../demangle\n",
            );
            copy(
                "ianlancetaylor/demangle",
                "demangle",
                "module github.com/ianlancetaylor/demangle\ngo 1.12\n",
            );
            std::fs::write(
                dir.join("main/go.mod"),
                "module pprofmain\ngo 1.17\nrequire github.com/google/pprof v0.0.0\nrequire github.com/ianlancetaylor/demangle v0.0.0\nreplace github.com/google/pprof => ../pprof\nreplace github.com/ianlancetaylor/demangle => ../demangle\n",
            )
            .unwrap();
            std::fs::write(
                dir.join("main/main.go"),
                "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\n\t\"github.com/google/pprof/driver\"\n)\n\nfunc main() {\n\tif err := driver.PProf(&driver.Options{}); err != nil {\n\t\tfmt.Fprintf(os.Stderr, \"pprof: %v\\n\", err)\n\t\tos.Exit(2)\n\t}\n}\n",
            )
            .unwrap();
            let out = Command::new("go")
                .current_dir(dir.join("main"))
                .args(["build", "-o"])
                .arg(&exe)
                .arg(".")
                .env("GOFLAGS", "-mod=mod")
                .env("GOPROXY", "off")
                .env("GOPATH", dir.join("gopath"))
                .output()
                .expect("run go build");
            assert!(
                out.status.success(),
                "building google/pprof from {vendor:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(exe)
        })
        .clone()
}

/// The 1-based line of the source file `path` holding `needle`: the first
/// one at or after the line holding `after` (a test's expected call lines,
/// found by their text rather than by number).
pub fn line_of(path: &Path, after: &str, needle: &str) -> u32 {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = src
        .lines()
        .position(|l| l.contains(after))
        .unwrap_or_else(|| panic!("no {after:?} in {}", path.display()));
    let i = src
        .lines()
        .enumerate()
        .skip(start)
        .find(|(_, l)| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} after {after:?} in {}", path.display()))
        .0;
    i as u32 + 1
}

/// Whether `perf_event_open` may record every process here (`record -a`):
/// root, or `perf_event_paranoid` at most 0.
pub fn whole_host_allowed() -> bool {
    perf_paranoid_at_most(0)
}

/// Whether `perf_event_open` may record context switches of our children
/// with their stacks (`record --off-cpu`): root, or `perf_event_paranoid`
/// at most 1.
pub fn off_cpu_allowed() -> bool {
    perf_paranoid_at_most(1)
}

/// Root, or `perf_event_paranoid` at most `level`.
fn perf_paranoid_at_most(level: i32) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(3);
    root || paranoid <= level
}

/// The path in environment variable `name`, which the Windows stage
/// (`scripts/test-windows.sh`) sets; a clear panic when it is not set.
pub fn windows_stage_path(name: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(name).unwrap_or_else(|| {
        panic!("{name} is not set: run this test through scripts/test-windows.sh")
    }))
}

/// What the Rust standard library in `libcallstack.a` links against on
/// x86_64-pc-windows-gnu (`rustc --print native-static-libs`).
pub const WINDOWS_NATIVE_LIBS: &[&str] = &[
    "-lkernel32",
    "-lntdll",
    "-luserenv",
    "-lws2_32",
    "-ldbghelp",
];

/// Runs mingw-w64's gcc with `-g`, `args` and `-o out`; a panic with its
/// errors when it fails.
pub fn mingw_gcc<S: AsRef<std::ffi::OsStr>>(args: &[S], out: &Path) {
    mingw_compile("x86_64-w64-mingw32-gcc", args, out);
}

fn mingw_compile<S: AsRef<std::ffi::OsStr>>(compiler: &str, args: &[S], out: &Path) {
    let mut cmd = Command::new(compiler);
    cmd.arg("-g").args(args).arg("-o").arg(out);
    let o = cmd.output().unwrap_or_else(|e| {
        panic!("run {compiler} (scripts/install-test-deps.sh installs it): {e}")
    });
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Builds the fixture `source` (in `tests/fixtures/c`: C, or C++ when it
/// ends in `.cpp`, then by mingw-w64's g++ with its runtime linked in
/// statically, as wine has no `libstdc++-6.dll`) with `flags` into `out`,
/// linked to the Windows stage's `libcallstack.a` with the C API's header
/// on the include path.
pub fn mingw_build_with_callstack(source: &str, flags: &[&str], out: &Path) {
    let lib = windows_stage_path("CALLSTACK_WINDOWS_LIB").join("libcallstack.a");
    assert!(lib.exists(), "{} is missing", lib.display());
    let mut args: Vec<std::ffi::OsString> = flags.iter().map(Into::into).collect();
    args.push("-I".into());
    args.push(
        workspace_root()
            .join("crates/callstack-capi/include")
            .into(),
    );
    args.push(c_fixtures().join(source).into());
    args.push(lib.into());
    args.extend(WINDOWS_NATIVE_LIBS.iter().map(Into::into));
    if source.ends_with(".cpp") {
        args.push("-static-libstdc++".into());
        args.push("-static-libgcc".into());
        mingw_compile("x86_64-w64-mingw32-g++", &args, out);
    } else {
        mingw_compile("x86_64-w64-mingw32-gcc", &args, out);
    }
}

/// The Rust toolchain's lld (`rust-lld`), which links COFF as `lld-link`
/// does (`-flavor link`).
pub fn rust_lld() -> PathBuf {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = |args: &[&str]| {
        let o = Command::new(&rustc).args(args).output().expect("run rustc");
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let sysroot = out(&["--print", "sysroot"]);
    let host = out(&["-vV"])
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    Path::new(&sysroot).join(format!("lib/rustlib/{host}/bin/rust-lld"))
}

/// Builds the fixture `source` (C, or C++ when it ends in `.cpp`) as MSVC
/// would: clang for `x86_64-pc-windows-msvc` with CodeView debug info at
/// `opt`, linked by lld into `dir/NAME.exe` and its PDB `dir/NAME.pdb`,
/// without a C runtime (entry point `entry`: such an image is for reading,
/// not for running). Returns the image's path.
pub fn clang_pe_with_pdb(source: &str, opt: &str, dir: &Path, name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let obj = dir.join(format!("{name}.obj"));
    let compiler = if source.ends_with(".cpp") {
        "clang++"
    } else {
        "clang"
    };
    let st = Command::new(compiler)
        .args([
            "--target=x86_64-pc-windows-msvc",
            opt,
            "-g",
            "-gcodeview",
            "-c",
        ])
        .arg(c_fixtures().join(source))
        .arg("-o")
        .arg(&obj)
        .status()
        .unwrap_or_else(|e| panic!("{compiler} (scripts/install-test-deps.sh installs it): {e}"));
    assert!(st.success(), "{compiler} {source}");
    let exe = dir.join(format!("{name}.exe"));
    let st = Command::new(rust_lld())
        .args([
            "-flavor",
            "link",
            "/debug",
            "/entry:entry",
            "/subsystem:console",
        ])
        .arg("/nodefaultlib")
        .arg(format!(
            "/pdb:{}",
            dir.join(format!("{name}.pdb")).display()
        ))
        .arg(format!("/out:{}", exe.display()))
        .arg(&obj)
        .status()
        .expect("rust-lld");
    assert!(st.success(), "rust-lld -flavor link {name}");
    exe
}

/// Every instruction's address in the code of `exe` (any format LLVM
/// reads: a PE image here), from `llvm-objdump -d`.
pub fn llvm_instruction_addrs(exe: &Path) -> Vec<u64> {
    let o = Command::new("llvm-objdump")
        .arg("-d")
        .arg(exe)
        .output()
        .expect("llvm-objdump (scripts/install-test-deps.sh installs llvm)");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (a, rest) = l.trim_start().split_once(':')?;
            // Instruction lines: "140001000: 89 0d ...", not "<label>:".
            (!rest.is_empty() && !l.ends_with(':'))
                .then(|| u64::from_str_radix(a, 16).ok())
                .flatten()
        })
        .collect()
}

/// Runs the Windows program `exe` with `args` under the stage's wine
/// (`CALLSTACK_WINE`); its standard output, after checking that it
/// succeeded (the panic shows both outputs).
pub fn run_under_wine(exe: &Path, args: &[&str]) -> String {
    let o = Command::new(windows_stage_path("CALLSTACK_WINE"))
        .arg(exe)
        .args(args)
        .env("WINEDEBUG", "-all")
        .output()
        .expect("run wine");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{} under wine: {}\nstdout:\n{stdout}\nstderr:\n{}",
        exe.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_gdb_bt() {
        let t = "#0  d () at t.c:3\n#1  0x0000555555555171 in c () at t.c:4\n#2  0x00007ffff7dcd24a in __libc_start_call_main (main=main@entry=0x1, argc=1) at ../sysdeps/nptl/libc_start_call_main.h:58\n";
        assert_eq!(
            super::parse_gdb_bt(t),
            vec!["d", "c", "__libc_start_call_main"]
        );
    }

    #[test]
    fn parses_gdb_pcs() {
        let t = "$1 = 0x401136\n$2 = 0x401136\nwarning: x = 0x5\n  $3 = 0x7ffff7dcd24a\n";
        let pcs = super::parse_gdb_pcs(t);
        assert_eq!(pcs, vec![0x401136, 0x401136, 0x7ffff7dcd24a]);
        assert_eq!(super::fold_repeats(pcs), vec![0x401136, 0x7ffff7dcd24a]);
    }
}
