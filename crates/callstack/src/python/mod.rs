//! CPython frames of another process (live or a core): which Python
//! function, file and line each interpreter thread is running, read from
//! the target's memory alone.
//!
//! The interpreter is found as py-spy finds it: the `_PyRuntime` symbol in
//! the ELF symbol table (`.dynsym` or `.symtab`; no debug info needed) of
//! the python executable or of `libpython`. Its version comes from the same
//! file (`Py_Version` from 3.11, else the file's name), and the struct
//! offsets from that version's own headers ([`layout`]). A version not in
//! the table is refused with [`PyError::Unsupported`], never guessed.
//!
//! From `_PyRuntime`: the interpreters, each one's thread states (with the
//! native thread id from 3.11), and each thread's chain of frames, innermost
//! first. Each frame says whether it is the last (outermost) one run by its
//! native `_PyEval_EvalFrameDefault` call ([`PyFrame::entry`]): from 3.11 one
//! evaluation loop call runs several Python frames (`is_entry` in 3.11, a
//! frame owned by the C stack marks the boundary from 3.12); before 3.11
//! each call runs one.
//!
//! ```no_run
//! use callstack::remote::{corefile::CoreFile, Lookup};
//! let core = CoreFile::open("core".as_ref(), None, &Lookup::default())?;
//! if let Ok(Some(py)) = callstack::python::Interpreter::find(core.snapshot(), &core) {
//!     for t in py.threads(&core).unwrap_or_default() {
//!         for f in &t.frames {
//!             println!("{:?} {} ({}:{:?})", t.native_tid, f.function, f.file, f.line);
//!         }
//!     }
//! }
//! # Ok::<(), callstack::remote::RemoteError>(())
//! ```

pub mod layout;
pub mod lines;
mod prefetch;
mod ran;
pub mod record;

use crate::remote::{Module, ReadTarget, Snapshot};
use layout::Layout;
use std::fmt;

/// Why Python frames could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PyError {
    /// The interpreter's version has no layout in the table.
    Unsupported {
        /// The version found (`3.14`, `3.6.15`).
        version: String,
        /// The file it was found in.
        file: String,
    },
    /// The target's memory did not read as the layout says (unsaved, or
    /// not a CPython structure): the address and what was read.
    BadMemory(u64, &'static str),
    /// The python file's symbols could not be read.
    File(String),
}

impl fmt::Display for PyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PyError::Unsupported { version, file } => write!(
                f,
                "Python {version} ({file}) is not supported (struct layouts are known for {}): Python frames are not shown",
                supported_versions()
            ),
            PyError::BadMemory(a, what) => {
                write!(f, "could not read the Python {what} at {a:#x}")
            }
            PyError::File(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for PyError {}

/// The versions whose frames are read, as a list for messages (`3.7, 3.8, ...`).
pub fn supported_versions() -> String {
    let v: Vec<String> = SUPPORTED.iter().map(|(a, b)| format!("{a}.{b}")).collect();
    v.join(", ")
}

/// The versions read: every one of the layout table (3.7, the first with
/// `_PyRuntime`, to 3.13).
const SUPPORTED: &[(u8, u8)] = &[(3, 7), (3, 8), (3, 9), (3, 10), (3, 11), (3, 12), (3, 13)];

/// The interpreter of a target: where `_PyRuntime` is, and its layout.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The version (major, minor, micro; micro 0 when only the file name
    /// gave it).
    pub version: (u8, u8, u8),
    /// The module (executable or `libpython`) holding the interpreter.
    pub module: String,
    /// The address of `_PyRuntime` in the target.
    pub runtime: u64,
    /// The address of `PyCode_Type`, when the symbol table has it: each
    /// frame's code object is checked to be one.
    pub code_type: Option<u64>,
    /// The address ranges of `_PyEval_EvalFrameDefault` (and of its
    /// `.cold` part, when the symbol table has it) in the target, when the
    /// symbol table gives their sizes: the native frames that run Python
    /// frames.
    pub eval_ranges: Vec<(u64, u64)>,
    layout: &'static Layout,
}

/// One Python frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame {
    /// The function's qualified name (`Class.method`; `co_qualname`), its
    /// name before 3.11.
    pub function: String,
    /// The code object's file name.
    pub file: String,
    /// The line being run, when the line table says.
    pub line: Option<u32>,
    /// The outermost frame of its `_PyEval_EvalFrameDefault` call: the
    /// frames up to and including this one replace that native frame.
    pub entry: bool,
}

/// One thread state of the interpreter.
#[derive(Clone, Debug, Default)]
pub struct PyThread {
    /// The native thread id (LWP) of the thread, when the version records it.
    pub native_tid: Option<u64>,
    /// The thread's `pthread_t`.
    pub thread_id: u64,
    /// Its frames, innermost first.
    pub frames: Vec<PyFrame>,
}

/// At most this many interpreters, threads per interpreter and frames per
/// thread are read (a cycle in bad memory ends there).
const MAX_INTERPRETERS: usize = 64;
const MAX_THREADS: usize = 4096;
const MAX_FRAMES: usize = 16384;
/// At most this many thread descriptors are read to find the tid's offset.
const MAX_DESCRIPTORS: usize = 64;
/// Strings and tables longer than this are taken for bad memory.
const MAX_STRING: u64 = 1 << 16;
const MAX_TABLE: u64 = 1 << 24;

/// `_PyInterpreterFrame.owner` of the frame a `_PyEval_EvalFrameDefault`
/// call puts at its base (3.12+).
const FRAME_OWNED_BY_CSTACK: u8 = 3;

/// Whether a module's path names a python executable or libpython
/// (`python3.11`, `libpython3.12.so.1.0`, `python3.13d`), and its version
/// from the name when it has one.
fn python_module(path: &str) -> Option<Option<(u8, u8)>> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython")
        .or_else(|| name.strip_prefix("python"))?;
    // `python`, `python3`: a name without the version.
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next().and_then(|s| s.parse::<u8>().ok());
    let minor = parts.next().and_then(|s| s.parse::<u8>().ok());
    if !rest.is_empty() && !rest.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some(major.zip(minor))
}

/// Whether the file at `path` (as the target maps it) may hold a CPython
/// interpreter: a python executable or libpython, by its name.
pub fn is_python_file(path: &str) -> bool {
    python_module(path).is_some()
}

/// The native function that runs Python frames (3.11+: several per
/// call; before: one per call).
pub const EVAL_FUNCTION: &str = "_PyEval_EvalFrameDefault";
/// Its cold part, where the compiler split one off.
const EVAL_FUNCTION_COLD: &str = "_PyEval_EvalFrameDefault.cold";

/// The symbols the reader needs from the python file.
#[derive(Default)]
struct Symbols {
    runtime: Option<u64>,
    version_addr: Option<u64>,
    code_type: Option<u64>,
    version: Option<u32>,
    eval: Vec<(u64, u64)>,
}

fn read_symbols(path: &std::path::Path) -> Result<Symbols, PyError> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = crate::remote::files::map_file(path)
        .map_err(|e| PyError::File(format!("{}: {e}", path.display())))?;
    let file = object::File::parse(&data[..])
        .map_err(|e| PyError::File(format!("{}: {e}", path.display())))?;
    let mut s = Symbols::default();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        let Ok(name) = sym.name() else { continue };
        if (name == EVAL_FUNCTION || name == EVAL_FUNCTION_COLD) && sym.size() > 0 {
            let r = (sym.address(), sym.address() + sym.size());
            if !s.eval.contains(&r) {
                s.eval.push(r);
            }
            continue;
        }
        let slot = match name {
            "_PyRuntime" => &mut s.runtime,
            "Py_Version" => &mut s.version_addr,
            "PyCode_Type" => &mut s.code_type,
            _ => continue,
        };
        if slot.is_none() && sym.address() != 0 {
            *slot = Some(sym.address());
        }
        if name == "Py_Version" && s.version.is_none() {
            // A constant: read from the file (read-only data may not be in a core).
            if let Some(section) = sym
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
            {
                if let Ok(Some(b)) = section.data_range(sym.address(), 4) {
                    s.version = Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
        }
    }
    Ok(s)
}

impl Interpreter {
    /// Finds the interpreter of a target from its modules: `Ok(None)` when
    /// no module is a python with `_PyRuntime`, an error when it is one of
    /// a version not supported.
    pub fn find(snap: &Snapshot, _mem: &dyn ReadTarget) -> Result<Option<Interpreter>, PyError> {
        Self::find_in(&snap.modules)
    }

    /// [`find`](Self::find) among `modules` (their files found, biases
    /// known), such as those a [`crate::remote::process::WhileStopped`]
    /// hook is given before a live process is stopped.
    pub fn find_in(modules: &[Module]) -> Result<Option<Interpreter>, PyError> {
        // libpython before the executable: a python linked to libpython has
        // `_PyRuntime` there only.
        let mut candidates: Vec<(&Module, Option<(u8, u8)>)> = modules
            .iter()
            .filter_map(|m| Some((m, python_module(&m.name)?)))
            .collect();
        candidates
            .sort_by_key(|(m, _)| !m.name.rsplit('/').next().unwrap_or("").starts_with("lib"));
        // A python without `_PyRuntime` (before 3.7): refused, unless
        // another module is the interpreter.
        let mut refusal = None;
        for (m, name_version) in candidates {
            let Some(path) = m.file.as_deref() else {
                // Its symbols are needed to find the interpreter.
                refusal.get_or_insert(PyError::File(format!(
                    "{}: file not found (or not the one the target ran): Python frames are not shown",
                    m.name
                )));
                continue;
            };
            let syms = read_symbols(path)?;
            let Some(runtime) = syms.runtime else {
                if let Some((a, b)) = name_version {
                    refusal.get_or_insert(PyError::Unsupported {
                        version: format!("{a}.{b}"),
                        file: m.name.clone(),
                    });
                }
                continue;
            };
            let version = match (syms.version, name_version) {
                (Some(hex), _) if hex >> 24 == 3 => {
                    ((hex >> 24) as u8, (hex >> 16) as u8, (hex >> 8) as u8)
                }
                (_, Some((a, b))) => (a, b, 0),
                _ => {
                    return Err(PyError::Unsupported {
                        version: "of unknown version".into(),
                        file: m.name.clone(),
                    })
                }
            };
            let shown = if version.2 == 0 && syms.version.is_none() {
                format!("{}.{}", version.0, version.1)
            } else {
                format!("{}.{}.{}", version.0, version.1, version.2)
            };
            let layout = match Layout::for_version(version.0, version.1) {
                Some(l) if SUPPORTED.contains(&(version.0, version.1)) => l,
                _ => {
                    return Err(PyError::Unsupported {
                        version: shown,
                        file: m.name.clone(),
                    })
                }
            };
            return Ok(Some(Interpreter {
                version,
                module: m.name.clone(),
                runtime: runtime.wrapping_add(m.bias),
                code_type: syms.code_type.map(|a| a.wrapping_add(m.bias)),
                eval_ranges: syms
                    .eval
                    .iter()
                    .map(|&(a, b)| (a.wrapping_add(m.bias), b.wrapping_add(m.bias)))
                    .collect(),
                layout,
            }));
        }
        match refusal {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Every thread state of every interpreter, with its frames and its
    /// native thread id: from the thread state (3.11+), else from glibc's
    /// thread descriptor its `pthread_t` points to ([`tid_offset`]), checked
    /// against `tids` (the target's threads).
    pub fn threads_of(
        &self,
        mem: &dyn ReadTarget,
        pid: u32,
        tids: &[u32],
    ) -> Result<Vec<PyThread>, PyError> {
        let mut threads = self.threads(mem)?;
        if threads.iter().all(|t| t.native_tid.is_some()) {
            return Ok(threads);
        }
        let pthreads: Vec<u64> = threads.iter().map(|t| t.thread_id).collect();
        if let Some(off) = tid_offset(mem, pid, &pthreads, tids) {
            for t in threads.iter_mut().filter(|t| t.native_tid.is_none()) {
                let mut b = [0u8; 4];
                if mem.read_bytes(t.thread_id.wrapping_add(off), &mut b) {
                    let tid = u32::from_le_bytes(b);
                    if tids.contains(&tid) {
                        t.native_tid = Some(u64::from(tid));
                    }
                }
            }
        }
        Ok(threads)
    }

    /// Every thread state of every interpreter, with its frames (the native
    /// thread id only where the thread state records it, 3.11+).
    pub fn threads(&self, mem: &dyn ReadTarget) -> Result<Vec<PyThread>, PyError> {
        self.threads_cached(mem, &mut Codes::default())
    }

    /// [`threads`](Self::threads), with what was read of the code objects
    /// kept in `codes` for the next call. A warm read then costs, per
    /// thread, one read of the target for the thread state and one per
    /// frame, plus one for all its code objects' headers together
    /// ([`ReadTarget::read_each`]: to check that each is the same code).
    fn threads_cached(
        &self,
        mem: &dyn ReadTarget,
        codes: &mut Codes,
    ) -> Result<Vec<PyThread>, PyError> {
        let l = self.layout;
        let r = Reader { mem, l };
        let head_at = l
            .runtime_interpreters_head
            .ok_or(PyError::BadMemory(self.runtime, "runtime"))?;
        let mut interp = r.ptr(self.runtime + head_at, "interpreter list")?;
        let mut out = Vec::new();
        let mut n_interp = 0;
        let interp_span = l.interp_threads_head.max(l.interp_next) + 8;
        let tstate_span = [
            l.tstate_native_thread_id,
            Some(l.tstate_thread_id),
            Some(l.tstate_next),
            l.tstate_frame,
            l.tstate_cframe,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
            + 8;
        while interp != 0 && n_interp < MAX_INTERPRETERS {
            n_interp += 1;
            let block = Block::read(mem, interp, interp_span);
            let ir = Reader { mem: &block, l };
            let mut tstate = ir.ptr(interp + l.interp_threads_head, "thread list")?;
            let mut n = 0;
            while tstate != 0 && n < MAX_THREADS {
                n += 1;
                // The thread state's fields in one read.
                let block = Block::read(mem, tstate, tstate_span);
                let tr = Reader { mem: &block, l };
                out.push(self.thread(mem, &tr, tstate, codes)?);
                tstate = tr.ptr(tstate + l.tstate_next, "thread state")?;
            }
            interp = ir.ptr(interp + l.interp_next, "interpreter")?;
        }
        Ok(out)
    }

    /// The thread at `tstate` of the target `mem` (`r` reads its thread
    /// state) with its frames: each frame read whole, then every code
    /// object's header in one read.
    fn thread(
        &self,
        mem: &dyn ReadTarget,
        r: &Reader,
        tstate: u64,
        codes: &mut Codes,
    ) -> Result<PyThread, PyError> {
        let l = self.layout;
        let native_tid = match l.tstate_native_thread_id {
            Some(o) => Some(r.u64(tstate + o, "thread state")?),
            None => None,
        };
        let thread_id = r.u64(tstate + l.tstate_thread_id, "thread state")?;
        let mut frame = match (l.tstate_frame, l.tstate_cframe, l.cframe_current_frame) {
            (Some(o), _, _) => r.ptr(tstate + o, "thread state")?,
            (None, Some(c), Some(cur)) => {
                let cframe = r.ptr(tstate + c, "thread state")?;
                if cframe == 0 {
                    0
                } else {
                    r.ptr(cframe + cur, "C frame")?
                }
            }
            _ => 0,
        };
        let frame_span = [
            Some(l.frame_code),
            Some(l.frame_previous),
            Some(l.frame_instr),
            l.frame_owner,
            l.frame_is_entry,
        ]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(0)
            + 8;
        // The frames' own fields, innermost first; `None` marks the base of
        // a `_PyEval_EvalFrameDefault` call (3.12+).
        let mut walked: Vec<Option<FrameFields>> = Vec::new();
        let mut n = 0;
        while frame != 0 && n < MAX_FRAMES {
            n += 1;
            // The frame's fields in one read.
            let block = Block::read(mem, frame, frame_span);
            let fr = Reader { mem: &block, l };
            let previous = fr.ptr(frame + l.frame_previous, "frame")?;
            let owner = match l.frame_owner {
                Some(o) => Some(fr.u8(frame + o, "frame")?),
                None => None,
            };
            if owner == Some(FRAME_OWNED_BY_CSTACK) {
                walked.push(None);
                frame = previous;
                continue;
            }
            let code = fr.ptr(frame + l.frame_code, "frame")?;
            if code != 0 {
                walked.push(Some(self.frame_fields(&fr, frame, code)?));
            }
            frame = previous;
        }
        // Every code object's header, in one read of the target.
        let code_span = self.code_span();
        let mut headers = vec![0u8; walked.len() * code_span as usize];
        let mut ok = vec![false; walked.len()];
        {
            let mut reqs: Vec<(u64, &mut [u8])> = headers
                .chunks_mut(code_span as usize)
                .zip(&walked)
                .map(|(buf, f)| (f.as_ref().map_or(0, |f| f.code), buf))
                .collect();
            reqs.retain(|r| r.0 != 0);
            let mut got = vec![false; reqs.len()];
            mem.read_each(&mut reqs, &mut got);
            let mut k = 0;
            for (i, f) in walked.iter().enumerate() {
                if f.is_some() {
                    ok[i] = got[k];
                    k += 1;
                }
            }
        }
        let mut frames: Vec<PyFrame> = Vec::new();
        for (i, f) in walked.iter().enumerate() {
            let Some(f) = f else {
                // The frame above it was that call's outermost.
                if let Some(last) = frames.last_mut() {
                    last.entry = true;
                }
                continue;
            };
            let header = &headers[i * code_span as usize..(i + 1) * code_span as usize];
            let block = Block::of(mem, f.code, if ok[i] { header } else { &[] });
            if let Some(pf) = self.frame(&block, f, codes)? {
                frames.push(pf);
            }
        }
        Ok(PyThread {
            native_tid,
            thread_id,
            frames,
        })
    }

    /// What a frame holds of its code and position (`r` reads the frame
    /// at `frame`; `code` is its code pointer, not null).
    fn frame_fields(&self, r: &Reader, frame: u64, code: u64) -> Result<FrameFields, PyError> {
        let l = self.layout;
        let instr = match l.code_code_adaptive {
            // 3.11+: a pointer into the code object's instructions.
            Some(_) => r.ptr(frame + l.frame_instr, "frame")?,
            // Before 3.11: `f_lasti`.
            None => u64::from(r.u32(frame + l.frame_instr, "frame")?),
        };
        let entry = match l.frame_is_entry {
            Some(o) => Some(r.u8(frame + o, "frame")? != 0),
            None => None,
        };
        Ok(FrameFields { code, instr, entry })
    }

    /// How much of a code object's header [`Self::frame`] reads.
    fn code_span(&self) -> u64 {
        let l = self.layout;
        let name_at = l.code_qualname.unwrap_or(l.code_name);
        [
            l.object_type,
            name_at,
            l.code_filename,
            l.code_firstlineno,
            l.code_linetable,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8
    }

    /// One frame, from its fields and its code object's header (read by
    /// `header`): `None` when its code is not a code object (3.13's frames
    /// of other executables).
    fn frame(
        &self,
        header: &Block,
        f: &FrameFields,
        codes: &mut Codes,
    ) -> Result<Option<PyFrame>, PyError> {
        let l = self.layout;
        let code = f.code;
        let name_at = l.code_qualname.unwrap_or(l.code_name);
        // The fields that say which code it is, compared with what was
        // read at that address before.
        let cr = Reader { mem: header, l };
        let key = [
            cr.ptr(code + l.object_type, "code object")?,
            cr.ptr(code + name_at, "code object")?,
            cr.ptr(code + l.code_filename, "code object")?,
            cr.ptr(code + l.code_linetable, "code object")?,
            u64::from(cr.u32(code + l.code_firstlineno, "code object")?),
        ];
        if self.code_type.is_some_and(|t| key[0] != t) {
            return Ok(None);
        }
        let known = codes.get(&code).is_some_and(|c| c.key == key);
        if !known {
            if codes.len() >= MAX_CODES {
                codes.clear();
            }
            let c = Code {
                key,
                function: cr.string(key[1])?,
                file: cr.string(key[2])?,
                first_line: i64::from(key[4] as u32 as i32),
                table: cr.bytes(key[3], MAX_TABLE)?,
                lines: Vec::new(),
            };
            codes.insert(code, c);
        }
        // Known, or inserted just now.
        let Some(c) = codes.get_mut(&code) else {
            return Ok(None);
        };
        let format = lines::Format::for_version(l.version);
        let offset = match l.code_code_adaptive {
            Some(start) => (f.instr as i64).wrapping_sub((code + start) as i64) / 2,
            None => {
                let lasti = i64::from(f.instr as u32 as i32);
                // In code units from 3.10.
                if l.version >= (3, 10) {
                    lasti * 2
                } else {
                    lasti
                }
            }
        };
        let line = match c.lines.iter().find(|x| x.0 == offset) {
            Some(&(_, line)) => line,
            None => {
                let line = lines::line_for(format, &c.table, c.first_line, offset);
                if c.lines.len() >= LINES_KEPT {
                    c.lines.remove(0);
                }
                c.lines.push((offset, line));
                line
            }
        };
        let entry = match (f.entry, l.frame_owner) {
            (Some(e), _) => e,
            // 3.12+: marked when the C stack's frame is met.
            (None, Some(_)) => false,
            // One frame per evaluation call.
            (None, None) => true,
        };
        Ok(Some(PyFrame {
            function: c.function.clone(),
            file: c.file.clone(),
            line,
            entry,
        }))
    }
}

/// What [`Interpreter::thread`] keeps of a frame between reading it and
/// reading its code object: the code's address, the instruction pointer
/// (3.11+) or `f_lasti`, and the entry mark where the frame has one.
struct FrameFields {
    code: u64,
    instr: u64,
    entry: Option<bool>,
}

/// What was read of one code object, by its address: the header fields
/// that identify it (type, name, file name, line table, first line), and
/// what they point to.
struct Code {
    key: [u64; 5],
    function: String,
    file: String,
    first_line: i64,
    table: Vec<u8>,
    /// The lines of the offsets met last (a sampler meets the same few
    /// again and again; the line table is read from its start each time).
    lines: Vec<(i64, Option<u32>)>,
}

/// At most this many offsets' lines are kept per code object.
const LINES_KEPT: usize = 8;

/// Code objects read, by address.
type Codes = std::collections::HashMap<u64, Code>;

/// At most this many code objects are kept by a [`Sampler`].
const MAX_CODES: usize = 1 << 16;

/// A span of the target read at once (at most 512 bytes); reads outside
/// it, or all reads when it could not be read, go to the target.
struct Block<'a> {
    mem: &'a dyn ReadTarget,
    base: u64,
    len: usize,
    bytes: [u8; 512],
}

impl<'a> Block<'a> {
    /// `span` bytes (512 at most) of `mem` at `base`, read now.
    fn read(mem: &'a dyn ReadTarget, base: u64, span: u64) -> Block<'a> {
        let mut b = Block::empty(mem, base);
        let len = (span as usize).min(b.bytes.len());
        if mem.read_bytes(base, &mut b.bytes[..len]) {
            b.len = len;
        }
        b
    }

    /// A block of bytes already read at `base` (empty: none were).
    fn of(mem: &'a dyn ReadTarget, base: u64, bytes: &[u8]) -> Block<'a> {
        let mut b = Block::empty(mem, base);
        let len = bytes.len().min(b.bytes.len());
        b.bytes[..len].copy_from_slice(&bytes[..len]);
        b.len = len;
        b
    }

    /// No bytes held: every read goes to `mem`.
    fn empty(mem: &'a dyn ReadTarget, base: u64) -> Block<'a> {
        Block {
            mem,
            base,
            len: 0,
            bytes: [0; 512],
        }
    }
}

impl ReadTarget for Block<'_> {
    fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
        if let Some(off) = addr.checked_sub(self.base) {
            let off = off as usize;
            if let Some(src) = off
                .checked_add(buf.len())
                .and_then(|end| self.bytes[..self.len].get(off..end))
            {
                buf.copy_from_slice(src);
                return true;
            }
        }
        self.mem.read_bytes(addr, buf)
    }
}

/// The Python stacks of a running process, read again and again (a
/// sampling profiler's reads: `record`): what was read of code objects is
/// kept between reads, and the offset of the native thread id in glibc's
/// thread descriptors (3.7-3.10) is found once.
pub struct Sampler {
    /// The interpreter read.
    pub interpreter: Interpreter,
    pid: u32,
    codes: Codes,
    /// The tid's offset in a thread descriptor, once found (3.7-3.10).
    tid_offset: Option<u64>,
    /// The ranges the last read asked for: read ahead by the next
    /// ([`prefetch::Prefetched`]).
    plan: Vec<(u64, usize)>,
    /// The buffer of the last read ahead, for the next one.
    ahead_bytes: Vec<u8>,
}

impl Sampler {
    /// A sampler of `interpreter`, of process `pid`.
    pub fn new(interpreter: Interpreter, pid: u32) -> Sampler {
        Sampler {
            interpreter,
            pid,
            codes: Codes::default(),
            tid_offset: None,
            plan: Vec::new(),
            ahead_bytes: Vec::new(),
        }
    }

    /// Every thread's frames now, with its native thread id (threads whose
    /// id is not known yet are left out). `mem` reads the running process:
    /// a thread that changes its frames during the read may give an error,
    /// or (rarely) a stack that never was.
    pub fn threads(&mut self, mem: &dyn ReadTarget) -> Result<Vec<PyThread>, PyError> {
        // Where the last read looked, read again in one call first.
        let buf = std::mem::take(&mut self.ahead_bytes);
        let ahead = prefetch::Prefetched::read_into(mem, &self.plan, buf);
        let read = self.interpreter.threads_cached(&ahead, &mut self.codes);
        (self.plan, self.ahead_bytes) = ahead.finish();
        let mut threads = read?;
        if threads.iter().any(|t| t.native_tid.is_none()) {
            if self.tid_offset.is_none() {
                let pthreads: Vec<u64> = threads.iter().map(|t| t.thread_id).collect();
                let tids = task_ids(self.pid);
                self.tid_offset = tid_offset(mem, self.pid, &pthreads, &tids);
            }
            if let Some(off) = self.tid_offset {
                for t in threads.iter_mut().filter(|t| t.native_tid.is_none()) {
                    let mut b = [0u8; 4];
                    if mem.read_bytes(t.thread_id.wrapping_add(off), &mut b) {
                        t.native_tid = Some(u64::from(u32::from_le_bytes(b)));
                    }
                }
            }
            threads.retain(|t| t.native_tid.is_some());
        }
        Ok(threads)
    }
}

/// The threads of process `pid` (`/proc/PID/task`).
fn task_ids(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// How many of a thread's Python frames (innermost first) one
/// `_PyEval_EvalFrameDefault` call runs: those up to and including the
/// first for which `entry` says [`PyFrame::entry`], or all of them. The frames of the
/// innermost evaluation call replace its native frame, the next ones the
/// next evaluation frame out, and so on.
pub fn eval_run<T>(frames: &[T], entry: impl Fn(&T) -> bool) -> usize {
    frames
        .iter()
        .position(entry)
        .map_or(frames.len(), |i| i + 1)
}

/// Where glibc's thread descriptor (`struct pthread`, at the address a
/// `pthread_t` holds) keeps the thread's kernel id: the offset, 4-aligned,
/// under 4 KiB, at which the main thread's descriptor (one of `pthreads`)
/// holds the process id, and every other descriptor one of `tids` (the
/// target's threads). `None` when there is no such offset (or no
/// descriptor can be read).
pub fn tid_offset(mem: &dyn ReadTarget, pid: u32, pthreads: &[u64], tids: &[u32]) -> Option<u64> {
    const SPAN: usize = 4096;
    // The main thread's state is the oldest: the last of the list.
    let mut chosen: Vec<u64> = pthreads.iter().copied().filter(|&p| p != 0).collect();
    if chosen.len() > MAX_DESCRIPTORS {
        let last = chosen[chosen.len() - 1];
        chosen.truncate(MAX_DESCRIPTORS - 1);
        chosen.push(last);
    }
    // What can be read of each descriptor, page by page: a descriptor may
    // lie less than `SPAN` bytes before the end of its mapping (the main
    // thread's, wherever the loader put it), and a read across that end
    // fails whole.
    let descs: Vec<Vec<u8>> = chosen
        .iter()
        .filter_map(|&p| {
            let mut b = Vec::with_capacity(SPAN);
            let mut at = p;
            while b.len() < SPAN {
                let page_end = (at | 0xfff).checked_add(1)?;
                let mut chunk = vec![0u8; ((page_end - at) as usize).min(SPAN - b.len())];
                if !mem.read_bytes(at, &mut chunk) {
                    break;
                }
                b.extend_from_slice(&chunk);
                at = page_end;
            }
            (b.len() >= 4).then_some(b)
        })
        .collect();
    (0..SPAN / 4).map(|i| i * 4).find_map(|off| {
        let at = |d: &Vec<u8>| {
            let w = d.get(off..off + 4)?;
            Some(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        };
        let holders = descs.iter().filter(|d| at(d) == Some(pid)).count();
        let all_threads = descs
            .iter()
            .all(|d| at(d).is_some_and(|t| tids.contains(&t)));
        (holders == 1 && all_threads).then_some(off as u64)
    })
}

/// Reads the target's memory as the layout says.
struct Reader<'a> {
    mem: &'a dyn ReadTarget,
    l: &'static Layout,
}

impl Reader<'_> {
    fn read(&self, addr: u64, buf: &mut [u8], what: &'static str) -> Result<(), PyError> {
        if self.mem.read_bytes(addr, buf) {
            Ok(())
        } else {
            Err(PyError::BadMemory(addr, what))
        }
    }
    fn u64(&self, addr: u64, what: &'static str) -> Result<u64, PyError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
    fn ptr(&self, addr: u64, what: &'static str) -> Result<u64, PyError> {
        self.u64(addr, what)
    }
    fn u32(&self, addr: u64, what: &'static str) -> Result<u32, PyError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u8(&self, addr: u64, what: &'static str) -> Result<u8, PyError> {
        let mut b = [0u8; 1];
        self.read(addr, &mut b, what)?;
        Ok(b[0])
    }

    /// A `bytes` object's contents.
    fn bytes(&self, obj: u64, max: u64) -> Result<Vec<u8>, PyError> {
        let len = self.u64(obj + self.l.varobject_size, "bytes object")?;
        if len > max {
            return Err(PyError::BadMemory(obj, "bytes object"));
        }
        let mut v = vec![0u8; len as usize];
        self.read(obj + self.l.bytes_sval, &mut v, "bytes object")?;
        Ok(v)
    }

    /// A `str` object (compact: every name and file name of a code object
    /// is) as UTF-8.
    fn string(&self, obj: u64) -> Result<String, PyError> {
        let l = self.l;
        let len = self.u64(obj + l.unicode_length, "string")?;
        let state = self.u32(obj + l.unicode_state, "string")?;
        let kind = (state >> 2) & 7;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        if len > MAX_STRING || !compact || !matches!(kind, 1 | 2 | 4) {
            return Err(PyError::BadMemory(obj, "string"));
        }
        let data = if ascii {
            obj + l.unicode_ascii_size
        } else {
            obj + l.unicode_compact_size
        };
        let mut raw = vec![0u8; (len * u64::from(kind)) as usize];
        self.read(data, &mut raw, "string")?;
        let chars: String = match kind {
            1 => raw.iter().map(|&b| char::from(b)).collect(),
            2 => raw
                .chunks_exact(2)
                .map(|c| {
                    char::from_u32(u32::from(u16::from_le_bytes([c[0], c[1]])))
                        .unwrap_or('\u{fffd}')
                })
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|c| {
                    char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .unwrap_or('\u{fffd}')
                })
                .collect(),
        };
        Ok(chars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory of words pointing back into itself (or not), as a target
    /// whose interpreter state is garbage.
    struct Garbage {
        base: u64,
        bytes: Vec<u8>,
    }

    impl ReadTarget for Garbage {
        fn read_bytes(&self, addr: u64, buf: &mut [u8]) -> bool {
            let Some(off) = addr.checked_sub(self.base) else {
                return false;
            };
            let off = off as usize;
            match self.bytes.get(off..off.saturating_add(buf.len())) {
                Some(src) if off.checked_add(buf.len()).is_some() => {
                    buf.copy_from_slice(src);
                    true
                }
                _ => false,
            }
        }
    }

    /// The threads' kernel ids are found in glibc's descriptors also when
    /// the main thread's lies less than a page before the end of its
    /// mapping (where the loader put it: with address randomization, now
    /// and then), so that no read of a whole page from it succeeds.
    #[test]
    fn tid_offset_reads_what_there_is_of_a_descriptor() {
        const TID: usize = 0x2d0;
        let base = 0x10_0000u64;
        // Two descriptors: a thread's at base, the main thread's 1 KiB
        // before the end of the memory.
        let mut bytes = vec![0u8; 0x3000];
        let thread = base;
        let main = base + 0x3000 - 0x400;
        bytes[TID..TID + 4].copy_from_slice(&4242u32.to_le_bytes());
        let m = (main - base) as usize + TID;
        bytes[m..m + 4].copy_from_slice(&4241u32.to_le_bytes());
        let mem = Garbage { base, bytes };
        assert_eq!(
            tid_offset(&mem, 4241, &[thread, main], &[4241, 4242]),
            Some(TID as u64)
        );
        // A tid that is no thread of the target: no offset.
        assert_eq!(tid_offset(&mem, 4241, &[thread, main], &[4241]), None);
    }

    #[test]
    fn garbage_memory_gives_errors_not_panics() {
        let base = 0x10_0000u64;
        let size = 1 << 16;
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..64 {
            let mut bytes = vec![0u8; size];
            for w in bytes.chunks_exact_mut(8) {
                // xorshift64
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let v = match state % 4 {
                    0 => base + (state >> 8) % size as u64,
                    1 => base + (((state >> 8) % size as u64) & !7),
                    2 => state >> (round % 60),
                    _ => 0,
                };
                w.copy_from_slice(&v.to_le_bytes());
            }
            let mem = Garbage { base, bytes };
            for layout in layout::LAYOUTS {
                let i = Interpreter {
                    version: (layout.version.0, layout.version.1, 0),
                    module: "python".into(),
                    runtime: base + (round as u64 * 64) % size as u64,
                    code_type: None,
                    eval_ranges: Vec::new(),
                    layout,
                };
                let _ = i.threads(&mem);
                let _ = i.threads_of(&mem, 1, &[1, 2, 3]);
            }
        }
    }

    #[test]
    fn python_module_names() {
        assert_eq!(python_module("/usr/bin/python3.11"), Some(Some((3, 11))));
        assert_eq!(
            python_module("/usr/lib/libpython3.12.so.1.0"),
            Some(Some((3, 12)))
        );
        assert_eq!(python_module("/usr/bin/python3"), Some(None));
        assert_eq!(python_module("/usr/lib/libpthread.so.0"), None);
        assert_eq!(python_module("/usr/bin/pythonista"), None);
    }
}
