//! The CPython struct offsets the frame reader needs, per version, as
//! `layout_gen.c` (compiled against that version's own headers with
//! `Py_BUILD_CORE`) prints them. `tests/python_layout.rs` recompiles the
//! generator against every version's headers found on the machine and
//! checks that this table says the same.
//!
//! The fields are named as the generator's output lines; a field a version
//! does not have is `None`. x86-64 (LP64) layouts of the default (GIL)
//! builds.

/// The offsets of one CPython minor version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (major, minor).
    pub version: (u8, u8),
    /// `_PyRuntimeState.interpreters.head` (3.7+: `_PyRuntime` exists).
    pub runtime_interpreters_head: Option<u64>,
    /// `PyInterpreterState.next`.
    pub interp_next: u64,
    /// `PyInterpreterState.threads.head` (`tstate_head` before 3.11).
    pub interp_threads_head: u64,
    /// `PyThreadState.next`.
    pub tstate_next: u64,
    /// `PyThreadState.native_thread_id` (3.11+): the thread's LWP.
    pub tstate_native_thread_id: Option<u64>,
    /// `PyThreadState.thread_id` (the thread's `pthread_t`).
    pub tstate_thread_id: u64,
    /// `PyThreadState.cframe` (3.11, 3.12).
    pub tstate_cframe: Option<u64>,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current_frame: Option<u64>,
    /// `PyThreadState.current_frame` (3.13), `PyThreadState.frame` (before 3.11).
    pub tstate_frame: Option<u64>,
    /// The frame's code object: `f_executable` (3.13), `f_code`.
    pub frame_code: u64,
    /// The calling frame: `previous` (3.11+), `f_back`.
    pub frame_previous: u64,
    /// The instruction: `instr_ptr` (3.13), `prev_instr` (3.11, 3.12),
    /// `f_lasti` (an `int`, before 3.11).
    pub frame_instr: u64,
    /// `_PyInterpreterFrame.owner` (a `char`, 3.11+).
    pub frame_owner: Option<u64>,
    /// `_PyInterpreterFrame.is_entry` (a `bool`, 3.11 only).
    pub frame_is_entry: Option<u64>,
    /// `PyCodeObject.co_filename`.
    pub code_filename: u64,
    /// `PyCodeObject.co_name`.
    pub code_name: u64,
    /// `PyCodeObject.co_qualname` (3.11+).
    pub code_qualname: Option<u64>,
    /// `PyCodeObject.co_code_adaptive` (3.11+): the instructions, inside the code object.
    pub code_code_adaptive: Option<u64>,
    /// `PyCodeObject.co_code` (a bytes object, before 3.11).
    pub code_code: Option<u64>,
    /// `PyCodeObject.co_firstlineno` (an `int`).
    pub code_firstlineno: u64,
    /// `PyCodeObject.co_linetable` (3.10+), `co_lnotab` (before): a bytes object.
    pub code_linetable: u64,
    /// `PyObject.ob_type`.
    pub object_type: u64,
    /// `PyVarObject.ob_size`.
    pub varobject_size: u64,
    /// `PyBytesObject.ob_sval`.
    pub bytes_sval: u64,
    /// `PyASCIIObject.length`.
    pub unicode_length: u64,
    /// `PyASCIIObject.state` (bit fields: kind in bits 2-4, compact bit 5,
    /// ascii bit 6, the same from 3.3 to 3.13).
    pub unicode_state: u64,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's characters follow it.
    pub unicode_ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: a compact non-ASCII string's characters follow it.
    pub unicode_compact_size: u64,
}

impl Layout {
    /// The layout of CPython `major.minor`, if it is in the table.
    pub fn for_version(major: u8, minor: u8) -> Option<&'static Layout> {
        LAYOUTS.iter().find(|l| l.version == (major, minor))
    }

    /// Every field as the generator prints it (`name value`), in its order;
    /// fields the version does not have are left out.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        let mut v = Vec::new();
        let mut o = |k: &'static str, x: Option<u64>| {
            if let Some(x) = x {
                v.push((k, x));
            }
        };
        o("runtime_interpreters_head", self.runtime_interpreters_head);
        o("interp_next", Some(self.interp_next));
        o("interp_threads_head", Some(self.interp_threads_head));
        o("tstate_next", Some(self.tstate_next));
        o("tstate_native_thread_id", self.tstate_native_thread_id);
        o("tstate_thread_id", Some(self.tstate_thread_id));
        if self.version >= (3, 13) || self.version < (3, 11) {
            o("tstate_frame", self.tstate_frame);
        } else {
            o("tstate_cframe", self.tstate_cframe);
            o("cframe_current_frame", self.cframe_current_frame);
        }
        o("frame_code", Some(self.frame_code));
        o("frame_previous", Some(self.frame_previous));
        o("frame_instr", Some(self.frame_instr));
        o("frame_owner", self.frame_owner);
        o("frame_is_entry", self.frame_is_entry);
        o("code_filename", Some(self.code_filename));
        o("code_name", Some(self.code_name));
        o("code_qualname", self.code_qualname);
        o("code_code_adaptive", self.code_code_adaptive);
        o("code_code", self.code_code);
        o("code_firstlineno", Some(self.code_firstlineno));
        o("code_linetable", Some(self.code_linetable));
        o("object_type", Some(self.object_type));
        o("varobject_size", Some(self.varobject_size));
        o("bytes_sval", Some(self.bytes_sval));
        o("unicode_length", Some(self.unicode_length));
        o("unicode_state", Some(self.unicode_state));
        o("unicode_ascii_size", Some(self.unicode_ascii_size));
        o("unicode_compact_size", Some(self.unicode_compact_size));
        v
    }
}

/// The versions whose layout is known (from 3.7, the first with `_PyRuntime`).
pub const LAYOUTS: &[Layout] = &[
    Layout {
        version: (3, 7),
        runtime_interpreters_head: Some(24),
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: None,
        tstate_thread_id: 176,
        tstate_cframe: None,
        cframe_current_frame: None,
        tstate_frame: Some(24),
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        frame_is_entry: None,
        code_filename: 96,
        code_name: 104,
        code_qualname: None,
        code_code_adaptive: None,
        code_code: Some(40),
        code_firstlineno: 36,
        code_linetable: 112,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    },
    Layout {
        version: (3, 8),
        runtime_interpreters_head: Some(32),
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: None,
        tstate_thread_id: 176,
        tstate_cframe: None,
        cframe_current_frame: None,
        tstate_frame: Some(24),
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        frame_is_entry: None,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_code_adaptive: None,
        code_code: Some(48),
        code_firstlineno: 40,
        code_linetable: 120,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    },
    Layout {
        version: (3, 9),
        runtime_interpreters_head: Some(32),
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: None,
        tstate_thread_id: 176,
        tstate_cframe: None,
        cframe_current_frame: None,
        tstate_frame: Some(24),
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 104,
        frame_owner: None,
        frame_is_entry: None,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_code_adaptive: None,
        code_code: Some(48),
        code_firstlineno: 40,
        code_linetable: 120,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    },
    Layout {
        version: (3, 10),
        runtime_interpreters_head: Some(32),
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_native_thread_id: None,
        tstate_thread_id: 176,
        tstate_cframe: None,
        cframe_current_frame: None,
        tstate_frame: Some(24),
        frame_code: 32,
        frame_previous: 24,
        frame_instr: 96,
        frame_owner: None,
        frame_is_entry: None,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_code_adaptive: None,
        code_code: Some(48),
        code_firstlineno: 40,
        code_linetable: 120,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    },
    Layout {
        version: (3, 11),
        runtime_interpreters_head: Some(40),
        interp_next: 0,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_native_thread_id: Some(160),
        tstate_thread_id: 152,
        tstate_cframe: Some(56),
        cframe_current_frame: Some(8),
        tstate_frame: None,
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: Some(69),
        frame_is_entry: Some(68),
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_code_adaptive: Some(184),
        code_code: None,
        code_firstlineno: 72,
        code_linetable: 136,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 48,
        unicode_compact_size: 72,
    },
    Layout {
        version: (3, 12),
        runtime_interpreters_head: Some(40),
        interp_next: 0,
        interp_threads_head: 72,
        tstate_next: 8,
        tstate_native_thread_id: Some(144),
        tstate_thread_id: 136,
        tstate_cframe: Some(56),
        cframe_current_frame: Some(0),
        tstate_frame: None,
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        frame_is_entry: None,
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_code_adaptive: Some(192),
        code_code: None,
        code_firstlineno: 68,
        code_linetable: 136,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 40,
        unicode_compact_size: 56,
    },
    Layout {
        version: (3, 13),
        runtime_interpreters_head: Some(632),
        interp_next: 7264,
        interp_threads_head: 7344,
        tstate_next: 8,
        tstate_native_thread_id: Some(160),
        tstate_thread_id: 152,
        tstate_cframe: None,
        cframe_current_frame: None,
        tstate_frame: Some(72),
        frame_code: 0,
        frame_previous: 8,
        frame_instr: 56,
        frame_owner: Some(70),
        frame_is_entry: None,
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_code_adaptive: Some(200),
        code_code: None,
        code_firstlineno: 68,
        code_linetable: 136,
        object_type: 8,
        varobject_size: 16,
        bytes_sval: 32,
        unicode_length: 16,
        unicode_state: 32,
        unicode_ascii_size: 40,
        unicode_compact_size: 56,
    },
];
