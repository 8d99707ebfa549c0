//! What `callstack core` and `callstack pstack` print: every thread's
//! frames, as text in the style of gdb's `thread apply all bt`, or as JSON
//! (the contract documented in README.md and docs/schema/core.schema.json):
//!
//! ```text
//! {"threads":[{"tid":N,"name":"..","frames":[{"pc":"0x..","function":"..",
//!   "file":"..","line":N,"inlined":false,"module":"..","method":"cfi|fp|context|scan|insn"}]}]}
//! ```
//!
//! Like gdb, a thread's frames include tail-call frames (functions that
//! ended with a jump to the next), marked `"tail_call":true` in JSON and
//! printed as ordinary frames in text.

use callstack::python::PyFrame;
use callstack::remote::{Lookup, ReadTarget, RemoteUnwinder, Snapshot, Unwound};
use callstack::symbolize::{Address, Debuginfod, ModuleInfo, SymbolExtent, Symbolizer};
use callstack::unwind::Memory;
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

/// The options `callstack core` and `callstack pstack` share: where to find
/// the target's files, and what to print.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Print JSON (the format documented in README.md) instead of text.
    #[arg(long)]
    json: bool,
    /// Show how each frame was found (context, cfi, fp, insn, scan) and a
    /// summary of the methods: the accuracy report.
    #[arg(long)]
    methods: bool,
    /// Show the frames below `main` too (gdb's `set backtrace past-main`).
    #[arg(long)]
    past_main: bool,
    /// Native frames only: do not read a CPython interpreter's frames
    /// (by default they replace the `_PyEval_EvalFrameDefault` frames that
    /// run them).
    #[arg(long)]
    no_python: bool,
    /// Look up the target's file paths under this directory first.
    #[arg(long, value_name = "DIR")]
    sysroot: Option<PathBuf>,
    /// A directory of separate debug files (`.build-id/xx/rest.debug`); repeatable.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
    #[command(flatten)]
    debuginfod: crate::debuginfod::DebuginfodArgs,
    /// The debuginfod client, made once: the lookup of the files and the
    /// symbolizer share it (and so its cache of answers and failures).
    #[arg(skip)]
    client: std::sync::OnceLock<Option<Arc<Debuginfod>>>,
}

impl ReportArgs {
    /// Where the target's files are looked up.
    pub fn lookup(&self) -> Lookup {
        Lookup {
            sysroot: self.sysroot.clone(),
            debug_dirs: self.debug_dir.clone(),
            debuginfod: self.client().clone(),
        }
    }

    /// The debuginfod client of the options, if any.
    fn client(&self) -> &Option<Arc<Debuginfod>> {
        self.client.get_or_init(|| self.debuginfod.client())
    }

    /// Unwinds and symbolizes every thread of `snap` ([`collect`]) and prints
    /// them as asked. `size` is the bytes the progress line counts (0: none).
    /// `target` reads the memory a CPython interpreter's frames are read
    /// from (unless `--no-python`).
    ///
    /// `header` comes first: its text lines before the threads, its JSON
    /// keys at the top level.
    pub fn print<M: Memory + Send>(
        &self,
        snap: &Snapshot,
        mem: &mut M,
        target: &dyn ReadTarget,
        size: u64,
        header: &Header,
    ) -> Result<(), String> {
        let python = if self.no_python {
            PythonFrames::default()
        } else {
            python_frames(snap, target)
        };
        self.print_with(snap, mem, python, size, header)
    }

    /// Whether Python frames are wanted (no `--no-python`).
    pub fn python(&self) -> bool {
        !self.no_python
    }

    /// [`print`](Self::print) with the Python frames already read (by
    /// [`PythonHook`] while a live process was stopped).
    pub fn print_with<M: Memory + Send>(
        &self,
        snap: &Snapshot,
        mem: &mut M,
        python: PythonFrames,
        size: u64,
        header: &Header,
    ) -> Result<(), String> {
        let progress = Progress::new(snap.threads.len(), size);
        let threads = collect(
            snap,
            mem,
            &progress,
            self.past_main,
            &self.debug_dir,
            self.client().clone(),
            &python,
        );
        crate::debuginfod::warn(self.client().as_ref());
        print_methods(&threads, self.json, self.methods, header)
    }
}

/// What is printed before the threads: lines of text (followed by an empty
/// line), and top-level JSON keys.
#[derive(Default)]
pub struct Header {
    /// Text lines, printed before the first thread.
    pub text: Vec<String>,
    /// Top-level keys of the JSON output.
    pub json: serde_json::Map<String, Value>,
}

/// Adds the JSON `executable` object of a core or a minidump (`null` when
/// the target names none): its name, the file used, and where the name came
/// from.
pub fn executable_header(
    header: &mut Header,
    exe: Option<&callstack::remote::corefile::CoreExecutable>,
) {
    let v = match exe {
        Some(e) => serde_json::json!({
            "name": e.name,
            "file": e.file.as_ref().map(|f| f.display().to_string()),
            "source": e.source.as_str(),
        }),
        None => serde_json::Value::Null,
    };
    header.json.insert("executable".into(), v);
}

/// Adds the signal that ended the process to `header`, as `callstack core`
/// prints it: gdb's two lines ("Program terminated with signal ...", "The
/// signal was received by thread N") and the JSON `signal` object (`null`
/// when there is none).
pub fn signal_header(
    header: &mut Header,
    sig: Option<&callstack::remote::corefile::CoreSignal>,
    snap: &Snapshot,
) {
    let signal = match sig {
        Some(sig) => {
            let (name, desc) = match sig.name(snap.arch) {
                Some((n, d)) => (Some(n), Some(d)),
                None => (None, None),
            };
            // The thread's number as printed (Thread N), in the source's order.
            let thread = snap
                .threads
                .iter()
                .position(|t| t.tid == sig.tid)
                .map(|i| i + 1);
            let mut line = format!(
                "Program terminated with signal {}, {}",
                name.map(String::from)
                    .unwrap_or_else(|| format!("{}", sig.number)),
                desc.unwrap_or("Unknown signal")
            );
            if let Some(a) = sig.address {
                line.push_str(&format!(" (fault address {a:#x})"));
            }
            line.push('.');
            header.text.push(line);
            header.text.push(match thread {
                Some(n) => format!("The signal was received by thread {n} (LWP {}).", sig.tid),
                None => format!("The signal was received by LWP {}.", sig.tid),
            });
            json!({
                "number": sig.number,
                "name": name,
                "description": desc,
                "code": sig.code,
                "address": sig.address.map(|a| format!("{a:#x}")),
                "tid": sig.tid,
                "thread": thread,
            })
        }
        None => Value::Null,
    };
    header.json.insert("signal".into(), signal);
}

/// The Python frames of each thread, by native thread id (empty when the
/// target runs no CPython interpreter, or it could not be read).
#[derive(Default)]
pub struct PythonFrames {
    by_tid: std::collections::HashMap<u64, Vec<PyFrame>>,
}

/// Reads the interpreter's threads ([`callstack::python`]); a version not
/// supported, or memory that does not read as the layout says, is one
/// warning on stderr, and the native frames are shown alone.
pub fn python_frames(snap: &Snapshot, target: &dyn ReadTarget) -> PythonFrames {
    let tids: Vec<u32> = snap.threads.iter().map(|t| t.tid).collect();
    let threads = callstack::python::Interpreter::find(snap, target).and_then(|i| match i {
        Some(i) => i.threads_of(target, snap.pid, &tids),
        None => Ok(Vec::new()),
    });
    python_frames_of(threads)
}

/// Reads a live process's Python frames while its threads are stopped
/// (`LiveProcess::capture_with`): the interpreter is found before the stop,
/// its threads read during it.
#[derive(Default)]
pub struct PythonHook {
    pid: u32,
    interp: Option<callstack::python::Interpreter>,
    result: Option<Result<Vec<callstack::python::PyThread>, callstack::python::PyError>>,
}

impl callstack::remote::process::WhileStopped for PythonHook {
    fn wants(&self, path: &str) -> bool {
        callstack::python::is_python_file(path)
    }
    fn prepare(&mut self, pid: u32, modules: &[callstack::remote::Module]) -> bool {
        self.pid = pid;
        match callstack::python::Interpreter::find_in(modules) {
            Ok(Some(i)) => {
                self.interp = Some(i);
                true
            }
            Ok(None) => false,
            Err(e) => {
                self.result = Some(Err(e));
                false
            }
        }
    }
    fn stopped(&mut self, mem: &dyn ReadTarget, tids: &[u32]) {
        if let Some(i) = &self.interp {
            self.result = Some(i.threads_of(mem, self.pid, tids));
        }
    }
}

impl PythonHook {
    /// The frames read (a warning on stderr if they could not be).
    pub fn frames(self) -> PythonFrames {
        python_frames_of(self.result.unwrap_or(Ok(Vec::new())))
    }
}

fn python_frames_of(
    threads: Result<Vec<callstack::python::PyThread>, callstack::python::PyError>,
) -> PythonFrames {
    match threads {
        Ok(threads) => PythonFrames {
            by_tid: threads
                .into_iter()
                .filter_map(|t| Some((t.native_tid?, t.frames)))
                .collect(),
        },
        Err(e) => {
            eprintln!("callstack: warning: {e}");
            PythonFrames::default()
        }
    }
}

/// The native function that runs Python frames.
use callstack::python::EVAL_FUNCTION;

/// Frames deeper than this are not unwound (a runaway chain ends here).
pub const MAX_FRAMES: usize = 1024;

/// One printed frame.
pub struct FrameOut {
    pub pc: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub inlined: bool,
    pub module: Option<String>,
    pub method: &'static str,
    /// The first printed entry of its pc (inlined levels follow without one).
    pub show_pc: bool,
    /// The signal-return trampoline a handler returned to: the frame below
    /// is the interrupted code (gdb's `<signal handler called>`).
    pub signal_trampoline: bool,
    /// A tail-call frame (gdb's `TAILCALL_FRAME`): a function that ran
    /// between the frame below and the one above but ended with a jump
    /// to the next, so it has no frame on the stack; found from the DWARF
    /// call sites. Its pc is the address just past that jump.
    pub tail_call: bool,
    /// A CPython frame (function, file, line of Python code), in place of
    /// the `_PyEval_EvalFrameDefault` frame that runs it.
    pub python: bool,
}

/// One printed thread.
pub struct ThreadOut {
    pub tid: u32,
    pub name: Option<String>,
    pub frames: Vec<FrameOut>,
    /// Why the walk ended before the outermost frame, if it did.
    pub stop: Option<String>,
}

/// Progress on stderr, only when it is a terminal and the job is large.
pub struct Progress {
    on: bool,
    total: usize,
}

impl Progress {
    pub fn new(total_threads: usize, bytes: u64) -> Progress {
        let large = total_threads >= 32 || bytes >= 1 << 30;
        Progress {
            on: large && std::io::stderr().is_terminal(),
            total: total_threads,
        }
    }
    fn tick(&self, i: usize) {
        if self.on {
            eprint!("\rcallstack: thread {}/{}", i + 1, self.total);
        }
    }
    fn done(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

/// Unwinds and symbolizes every thread of `snap`.
///
/// Unwinding (which reads the target's memory and compiles CFI tables) and
/// symbolizing (which opens debug info) run on two threads, as a pipeline:
/// a thread's frames are named while the next thread is unwound.
///
/// Like gdb, a thread's frames end at `main` unless `past_main` is set.
pub fn collect<M: Memory + Send>(
    snap: &Snapshot,
    mem: &mut M,
    progress: &Progress,
    past_main: bool,
    debug_dirs: &[PathBuf],
    debuginfod: Option<Arc<Debuginfod>>,
    python: &PythonFrames,
) -> Vec<ThreadOut> {
    let out = std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Unwound)>();
        // The unwinder on a helper thread; the symbolizer, whose large
        // buffers are best served by the main thread's heap, here.
        scope.spawn(move || {
            let unwinder = RemoteUnwinder::new(snap);
            for (i, t) in snap.threads.iter().enumerate() {
                if tx.send((i, unwinder.unwind(mem, t, MAX_FRAMES))).is_err() {
                    break;
                }
            }
        });
        let mut sym = Names::new(snap, debug_dirs, debuginfod);
        let out: Vec<ThreadOut> = rx
            .into_iter()
            .map(|(i, u)| {
                progress.tick(i);
                let t = &snap.threads[i];
                let py = python.by_tid.get(&u64::from(t.tid)).map(|v| v.as_slice());
                name_thread(snap, t, u, &mut sym, past_main, py.unwrap_or(&[]))
            })
            .collect();
        // Split DWARF found missing while naming (a `.dwo` moved away):
        // one warning per file.
        for (_, report) in sym.files.debug_info() {
            for e in &report.degraded {
                if e.kind == callstack::symbolize::ErrorKind::MissingSplitDwarf {
                    eprintln!("callstack: warning: {e}");
                }
            }
        }
        // The process ends right after printing: tearing down parsed debug
        // info would only cost time.
        std::mem::forget(sym);
        out
    });
    progress.done();
    out
}

/// Whether the frames printed so far end with the real frame where gdb
/// ends a backtrace: the program's `main` ([`crate::mainfn`]'s rule for the
/// module of that frame). Inlined levels come before their real frame, so
/// only the last level printed is looked at.
fn ends_at_main(frames: &[FrameOut], rule: Option<&crate::mainfn::MainRule>) -> bool {
    let (Some(last), Some(rule)) = (frames.last(), rule) else {
        return false;
    };
    // A Python function called `main` is not the program's.
    !last.inlined && !last.python && last.function.as_deref().is_some_and(|f| rule.stops_at(f))
}

fn name_thread(
    snap: &Snapshot,
    t: &callstack::remote::Thread,
    unwound: Unwound,
    sym: &mut Names,
    past_main: bool,
    mut python: &[PyFrame],
) -> ThreadOut {
    let mut frames: Vec<FrameOut> = Vec::new();
    let mut stop = unwound.stop.clone();
    // The main rule of the module of the last real frame printed.
    let mut rule: Option<crate::mainfn::MainRule> = None;
    for (k, f) in unwound.frames.iter().enumerate() {
        let signal_trampoline = unwound.returns_to_signal_trampoline(k);
        let lookup = unwound.lookup(k);
        if !past_main && ends_at_main(&frames, rule.as_ref()) {
            stop = None;
            break;
        }
        let module = snap.module_at(lookup).map(|(_, m)| m);
        let module_name = module.map(|m| m.name.clone());
        // The tail-call frames between this frame and the one below, when
        // this one was found through the CFI of the one below (as gdb
        // looks for them only then) at a return address.
        let below = k
            .checked_sub(1)
            .map(|b| (unwound.frames[b].pc, unwound.lookup(b)));
        if let (Some(below), Some(m)) = (below, module) {
            if f.method == callstack::remote::Method::Cfi && lookup != f.pc {
                for pc in sym.tail_calls(m, f.pc, below) {
                    // One frame per tail call, named (as gdb names it)
                    // after the innermost function at the jump: an
                    // inlined one if the jump was inlined.
                    let s = sym
                        .names(Some(m), pc, pc.saturating_sub(1))
                        .into_iter()
                        .next()
                        .unwrap_or_default();
                    frames.push(FrameOut {
                        pc,
                        function: s.function,
                        file: s.file,
                        line: s.line,
                        inlined: false,
                        module: module_name.clone(),
                        method: json_method(f.method),
                        show_pc: true,
                        signal_trampoline: false,
                        tail_call: true,
                        python: false,
                    });
                }
            }
        }
        let syms = sym.names(module, f.pc, lookup);
        if syms.is_empty() {
            let jit = module.is_none().then(|| sym.jit_name(lookup)).flatten();
            let (function, file, line) = match jit {
                Some((n, file, line)) => (Some(n), file, line),
                None => (None, None, None),
            };
            frames.push(FrameOut {
                pc: f.pc,
                function,
                file,
                line,
                inlined: false,
                module: module_name.clone(),
                method: json_method(f.method),
                show_pc: true,
                signal_trampoline,
                tail_call: false,
                python: false,
            });
        }
        let n_syms = syms.len();
        for (k, s) in syms.into_iter().enumerate() {
            if signal_trampoline && k > 0 {
                break;
            }
            // The evaluation loop's own level (its inlined callees stay):
            // the Python frames it runs, innermost first, up to its entry.
            if k + 1 == n_syms && !python.is_empty() && s.function.as_deref() == Some(EVAL_FUNCTION)
            {
                let n = callstack::python::eval_run(python, |p| p.entry);
                for p in &python[..n] {
                    frames.push(python_frame(f.pc, module_name.clone(), f.method, p));
                }
                python = &python[n..];
                continue;
            }
            frames.push(FrameOut {
                pc: f.pc,
                function: s.function,
                file: s.file,
                line: s.line,
                inlined: s.inlined,
                module: module_name.clone(),
                method: json_method(f.method),
                show_pc: k == 0,
                signal_trampoline,
                tail_call: false,
                python: false,
            });
        }
        // Read the module's rule only when the real frame just printed may
        // be `main`: that spares reading large debug files (libc's).
        rule = match (module, frames.last()) {
            (Some(m), Some(last))
                if !past_main
                    && !last.inlined
                    && !last.python
                    && last
                        .function
                        .as_deref()
                        .is_some_and(crate::mainfn::may_be_main) =>
            {
                Some(sym.main_rule(m).clone())
            }
            _ => None,
        };
    }
    // Python frames whose evaluation loop's frame was not reached (the
    // native walk ended early): outermost last, after the native frames.
    for p in python {
        frames.push(python_frame(0, None, callstack::remote::Method::Cfi, p));
    }
    ThreadOut {
        tid: t.tid,
        name: t.name.clone(),
        frames,
        stop,
    }
}

/// A Python frame as printed, in place of the evaluation loop's frame at
/// `pc` (its module and method).
fn python_frame(
    pc: u64,
    module: Option<String>,
    method: callstack::remote::Method,
    p: &PyFrame,
) -> FrameOut {
    FrameOut {
        pc,
        function: Some(p.function.clone()),
        file: Some(p.file.clone()),
        line: p.line,
        inlined: false,
        module,
        method: json_method(method),
        show_pc: false,
        signal_trampoline: false,
        tail_call: false,
        python: true,
    }
}

/// Names frames: the crate's Symbolizer for modules found on disk, and a
/// the same Symbolizer over the in-memory images (the vDSO) of the others.
struct Names {
    files: Symbolizer,
    /// One per in-memory image, by module start (`None`: not an object).
    images: std::collections::HashMap<u64, Option<Symbolizer>>,
    /// Each module's `main` rule, read once (by module start).
    main_rules: std::collections::HashMap<u64, crate::mainfn::MainRule>,
    /// The process's jitdump files and perf map, naming JIT code that lies
    /// in no module.
    jit: callstack::symbolize::jit::JitSources,
}

impl Names {
    fn new(snap: &Snapshot, debug_dirs: &[PathBuf], debuginfod: Option<Arc<Debuginfod>>) -> Names {
        let infos: Vec<ModuleInfo> = snap
            .modules
            .iter()
            .filter(|m| m.image.is_none())
            .filter_map(|m| {
                Some(ModuleInfo {
                    path: m.file.clone()?,
                    build_id: m.build_id.clone(),
                    start: m.start as usize,
                    end: m.end as usize,
                    bias: Some(m.bias as usize),
                })
            })
            .collect();
        let mut files = Symbolizer::from_modules(infos);
        // gdb's names: an address past a symbol's size is `??`.
        files.set_symbol_extent(SymbolExtent::Sized);
        // gdb's C++ names: `ns::f` for a function without a linkage name.
        files.set_scoped_names(true);
        for d in debug_dirs {
            files.add_debug_dir(d);
        }
        files.set_debuginfod(debuginfod);
        // A core's map is the one its process wrote, if the file is still
        // there (it names only code in no module, so a map left by a later
        // process with the same pid can at worst name such code wrongly).
        // A runtime maps its jitdump file (executable) for perf to find:
        // the mapping names the file, read while it is still there.
        let mapped: Vec<PathBuf> = snap
            .modules
            .iter()
            .map(|m| m.file.clone().unwrap_or_else(|| PathBuf::from(&m.name)))
            .collect();
        let jit = callstack::symbolize::jit::JitSources::for_process(
            snap.pid,
            mapped.iter().map(PathBuf::as_path),
            &mut |w| eprintln!("callstack: warning: {w}"),
        );
        Names {
            files,
            images: std::collections::HashMap::new(),
            main_rules: std::collections::HashMap::new(),
            jit,
        }
    }

    /// What the jitdump files, then the perf map, say of `pc` (JIT code in
    /// no module): the function, and its file and line when known.
    fn jit_name(&self, pc: u64) -> Option<(String, Option<String>, Option<u32>)> {
        let f = self.jit.lookup(pc)?;
        Some((f.name, f.file, f.line))
    }

    /// Where backtraces end in module `m`: see [`crate::mainfn`]. A module
    /// without a file on disk ends them at a function called `main`.
    fn main_rule(&mut self, m: &callstack::remote::Module) -> &crate::mainfn::MainRule {
        self.main_rules.entry(m.start).or_insert_with(|| {
            match m.debug_file.as_ref().or(m.file.as_ref()) {
                Some(p) => crate::mainfn::main_rule(p),
                None => crate::mainfn::MainRule::At("main".into()),
            }
        })
    }

    /// The return addresses of the tail calls between a caller at `pc`
    /// (a return address in module `m`) and the frame below it (its pc and
    /// the address it is looked up at), innermost first (see
    /// [`Symbolizer::tail_calls`]).
    fn tail_calls(
        &mut self,
        m: &callstack::remote::Module,
        pc: u64,
        (below_pc, below_lookup): (u64, u64),
    ) -> Vec<u64> {
        if m.image.is_some() || m.file.is_none() {
            return Vec::new();
        }
        let callee = if below_lookup == below_pc {
            Address::Exact(below_pc as usize)
        } else {
            Address::Return(below_pc as usize)
        };
        self.files
            .tail_calls(pc as usize, callee)
            .into_iter()
            .map(|a| a as u64)
            .collect()
    }

    /// The levels at `pc` (inlined first), looked up at `lookup`.
    fn names(
        &mut self,
        module: Option<&callstack::remote::Module>,
        pc: u64,
        lookup: u64,
    ) -> Vec<Symbol> {
        let Some(m) = module else { return Vec::new() };
        if m.image.is_some() {
            return self.image_names(m, lookup);
        }
        if m.file.is_none() {
            return Vec::new();
        }
        let addr = if lookup == pc {
            Address::Exact(pc as usize)
        } else {
            Address::Return(pc as usize)
        };
        symbols_of(self.files.symbolize(addr))
    }

    /// The levels at `lookup` in an image read from the target (the vDSO),
    /// through a Symbolizer of that image at its link-time addresses.
    fn image_names(&mut self, m: &callstack::remote::Module, lookup: u64) -> Vec<Symbol> {
        let Some(img) = &m.image else {
            return Vec::new();
        };
        let s = self.images.entry(m.start).or_insert_with(|| {
            let mut s = Symbolizer::for_bytes(img.to_vec()).ok()?;
            s.set_symbol_extent(SymbolExtent::Sized);
            Some(s)
        });
        match s {
            Some(s) => {
                symbols_of(s.symbolize(Address::Exact(lookup.wrapping_sub(m.bias) as usize)))
            }
            None => Vec::new(),
        }
    }
}

/// What is known of one address, one entry per inlined level.
#[derive(Clone, Debug, Default)]
struct Symbol {
    function: Option<String>,
    file: Option<String>,
    line: Option<u32>,
    /// Whether this level was inlined into the next one.
    inlined: bool,
}

fn symbols_of(s: &callstack::symbolize::Symbolized) -> Vec<Symbol> {
    s.frames
        .iter()
        .map(|f| Symbol {
            function: f.function.as_deref().map(String::from),
            file: f.file.as_deref().map(String::from),
            line: f.line,
            inlined: f.inlined,
        })
        .collect()
}

/// Prints warnings of the snapshot on stderr.
pub fn warn(snap: &Snapshot) {
    for w in &snap.warnings {
        eprintln!("callstack: warning: {w}");
    }
}

/// How many native frames each method found, in a fixed order
/// (`context`, `cfi`, `fp`, `insn`, `scan`, then any other).
pub fn method_counts(threads: &[ThreadOut]) -> Vec<(&'static str, usize)> {
    let mut counts: Vec<(&'static str, usize)> = ["context", "cfi", "fp", "insn", "scan"]
        .iter()
        .map(|m| (*m, 0))
        .collect();
    // Python frames stand for an evaluation loop frame: not native frames
    // found by a method.
    for f in threads.iter().flat_map(|t| &t.frames).filter(|f| !f.python) {
        match counts.iter_mut().find(|c| c.0 == f.method) {
            Some(c) => c.1 += 1,
            None => counts.push((f.method, 1)),
        }
    }
    counts
}

/// gdb-like text; with `methods`, each frame ends with `[method]` (how it
/// was found: `context`, `cfi`, `fp`, `insn`, `scan`) and a last line sums
/// them up: `methods: cfi 12, insn 6, ... (N frames)`.
pub fn print_text_methods(
    threads: &[ThreadOut],
    w: &mut impl Write,
    methods: bool,
) -> std::io::Result<()> {
    for (i, t) in threads.iter().enumerate() {
        if i > 0 {
            writeln!(w)?;
        }
        match &t.name {
            Some(n) => writeln!(w, "Thread {} (LWP {} \"{}\"):", i + 1, t.tid, n)?,
            None => writeln!(w, "Thread {} (LWP {}):", i + 1, t.tid)?,
        }
        for (k, f) in t.frames.iter().enumerate() {
            write!(w, "#{k:<2} ")?;
            if f.signal_trampoline {
                // As gdb prints the frame of a signal trampoline.
                write!(w, "<signal handler called>")?;
                if methods {
                    write!(w, " [{}]", f.method)?;
                }
                writeln!(w)?;
                continue;
            }
            if f.python {
                // py-spy's form: `function (file:line)`.
                write!(w, "[python] {} (", f.function.as_deref().unwrap_or("??"))?;
                write!(w, "{}", f.file.as_deref().unwrap_or("??"))?;
                if let Some(line) = f.line {
                    write!(w, ":{line}")?;
                }
                write!(w, ")")?;
                if methods {
                    write!(w, " [{}]", f.method)?;
                }
                writeln!(w)?;
                continue;
            }
            if f.show_pc {
                write!(w, "0x{:016x} in ", f.pc)?;
            }
            write!(w, "{} ()", f.function.as_deref().unwrap_or("??"))?;
            match (&f.file, f.line, &f.module) {
                (Some(file), Some(line), _) => write!(w, " at {file}:{line}")?,
                (Some(file), None, _) => write!(w, " at {file}")?,
                (None, _, Some(m)) => write!(w, " from {m}")?,
                _ => {}
            }
            if methods {
                write!(w, " [{}]", f.method)?;
            }
            writeln!(w)?;
        }
        if let Some(why) = &t.stop {
            writeln!(w, "Backtrace stopped: {why}")?;
        }
    }
    if methods {
        let counts = method_counts(threads);
        let total: usize = counts.iter().map(|c| c.1).sum();
        let parts: Vec<String> = counts
            .iter()
            .filter(|c| c.1 > 0)
            .map(|c| format!("{} {}", c.0, c.1))
            .collect();
        writeln!(w, "\nmethods: {} ({total} frames)", parts.join(", "))?;
    }
    Ok(())
}

/// The JSON contract.
pub fn to_json(threads: &[ThreadOut]) -> Value {
    let threads: Vec<Value> = threads
        .iter()
        .map(|t| {
            let frames: Vec<Value> = t
                .frames
                .iter()
                .map(|f| {
                    let mut v = json!({
                        "pc": format!("{:#x}", f.pc),
                        "function": f.function,
                        "file": f.file,
                        "line": f.line,
                        "inlined": f.inlined,
                        "module": f.module,
                        "method": f.method,
                    });
                    if f.signal_trampoline {
                        // gdb's `<signal handler called>` frame.
                        v["signal_handler_called"] = json!(true);
                    }
                    if f.tail_call {
                        // gdb's tail-call frame.
                        v["tail_call"] = json!(true);
                    }
                    if f.python {
                        // A CPython frame: function, file and line of
                        // Python code.
                        v["python"] = json!(true);
                    }
                    v
                })
                .collect();
            json!({"tid": t.tid, "name": t.name, "frames": frames})
        })
        .collect();
    json!({ "schema_version": SCHEMA_VERSION, "threads": threads })
}

/// The `schema_version` of the JSON of `core` and `pstack`
/// (docs/schema/core.schema.json, docs/schema/pstack.schema.json): raised
/// when a key is removed or changes meaning; new keys keep it.
pub const SCHEMA_VERSION: u32 = 1;

/// Prints in the chosen format; with `methods`, the accuracy report: text
/// frames end with `[method]` plus a summary line, JSON gains a top-level
/// `"methods": {"cfi": N, "insn": N, ...}` (each frame's `"method"` is
/// always there).
pub fn print_methods(
    threads: &[ThreadOut],
    as_json: bool,
    methods: bool,
    header: &Header,
) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let r = if as_json {
        let mut v = to_json(threads);
        for (k, x) in &header.json {
            v[k] = x.clone();
        }
        if methods {
            let m: serde_json::Map<String, Value> = method_counts(threads)
                .into_iter()
                .map(|(k, n)| (k.to_string(), json!(n)))
                .collect();
            v["methods"] = Value::Object(m);
        }
        serde_json::to_writer(&mut w, &v)
            .map_err(std::io::Error::other)
            .and_then(|_| writeln!(w))
    } else {
        let mut r = Ok(());
        for line in &header.text {
            r = r.and_then(|_| writeln!(w, "{line}"));
        }
        if !header.text.is_empty() {
            r = r.and_then(|_| writeln!(w));
        }
        r.and_then(|_| print_text_methods(threads, &mut w, methods))
    };
    r.and_then(|_| w.flush())
        .map_err(|e| format!("writing the output: {e}"))
}

/// The `method` value of the JSON contract (`context|cfi|fp|insn|scan`): a
/// frame found through a kernel signal frame comes from saved registers, so
/// it is `context`.
fn json_method(m: callstack::remote::Method) -> &'static str {
    match m {
        callstack::remote::Method::SignalFrame => "context",
        m => m.as_str(),
    }
}
