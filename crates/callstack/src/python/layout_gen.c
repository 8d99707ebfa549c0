/* Prints the struct offsets callstack's Python frame reader needs, from
 * the headers of the CPython version it is compiled against:
 *   gcc -I $PREFIX/include/python3.X layout_gen.c && ./a.out
 * One "name value" line per field; crates/callstack/src/python/layout.rs
 * holds the same numbers per version, and tests/python_layout.rs checks
 * them against this program's output for each version on the machine. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x03090000
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#elif PY_VERSION_HEX >= 0x03080000
#include <internal/pycore_pystate.h>
#elif PY_VERSION_HEX >= 0x03070000
#include <internal/pystate.h>
#endif
#if PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#else
#include <frameobject.h>
#endif

#define P(name, value) printf("%s %zu\n", name, (size_t)(value))

int main(void) {
    printf("version %d.%d\n", PY_MAJOR_VERSION, PY_MINOR_VERSION);
#if PY_VERSION_HEX >= 0x03070000
    P("runtime_interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
#endif
    P("interp_next", offsetof(PyInterpreterState, next));
#if PY_VERSION_HEX >= 0x030B0000
    P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
#else
    P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
#endif
    P("tstate_next", offsetof(PyThreadState, next));
#if PY_VERSION_HEX >= 0x030B0000
    P("tstate_native_thread_id", offsetof(PyThreadState, native_thread_id));
#endif
    P("tstate_thread_id", offsetof(PyThreadState, thread_id));
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
#elif PY_VERSION_HEX >= 0x030B0000
    P("tstate_cframe", offsetof(PyThreadState, cframe));
    P("cframe_current_frame", offsetof(_PyCFrame, current_frame));
#else
    P("tstate_frame", offsetof(PyThreadState, frame));
#endif
#if PY_VERSION_HEX >= 0x030D0000
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#elif PY_VERSION_HEX >= 0x030B0000
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#endif
#else
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
#endif
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_name", offsetof(PyCodeObject, co_name));
#if PY_VERSION_HEX >= 0x030B0000
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
#else
    P("code_code", offsetof(PyCodeObject, co_code));
#endif
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
    P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#endif
    P("object_type", offsetof(PyObject, ob_type));
    P("varobject_size", offsetof(PyVarObject, ob_size));
    P("bytes_sval", offsetof(PyBytesObject, ob_sval));
    P("unicode_length", offsetof(PyASCIIObject, length));
    P("unicode_state", offsetof(PyASCIIObject, state));
    P("unicode_ascii_size", sizeof(PyASCIIObject));
    P("unicode_compact_size", sizeof(PyCompactUnicodeObject));
    return 0;
}
