//! framehop driven in-process: every loaded module registered from its
//! ELF file (text, eh_frame, eh_frame_hdr, got), the registers read at
//! the capture, stack reads bounded by the thread's stack.
#[cfg(target_arch = "aarch64")]
use framehop::aarch64::{
    CacheAarch64 as CacheNative, UnwindRegsAarch64, UnwinderAarch64 as UnwinderNative,
};
#[cfg(target_arch = "x86_64")]
use framehop::x86_64::{
    CacheX86_64 as CacheNative, UnwindRegsX86_64, UnwinderX86_64 as UnwinderNative,
};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use object::{Object, ObjectSection};
use std::cell::RefCell;

pub struct State {
    unwinder: UnwinderNative<Vec<u8>>,
    cache: CacheNative,
    stack: (u64, u64),
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

fn stack_range() -> (u64, u64) {
    // SAFETY: pthread_getattr_np on the current thread, then reading the
    // stack address and size it reports.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_getattr_np(libc::pthread_self(), &mut attr);
        let mut addr = std::ptr::null_mut();
        let mut size = 0;
        libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (addr as u64, addr as u64 + size as u64)
    }
}

/// framehop unwinds this architecture.
pub fn available() -> bool {
    true
}

pub fn setup() -> State {
    let mut unwinder = UnwinderNative::new();
    for m in callstack::modules::loaded_modules() {
        if m.is_vdso {
            continue;
        }
        let Ok(data) = std::fs::read(&m.path) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        let sec = |n: &str| file.section_by_name(n);
        let range = |n: &str| sec(n).map(|s| s.address()..s.address() + s.size());
        let bytes = |n: &str| sec(n).and_then(|s| s.data().ok()).map(|d| d.to_vec());
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: range(".text"),
            text: bytes(".text"),
            got_svma: range(".got"),
            eh_frame_svma: range(".eh_frame"),
            eh_frame: bytes(".eh_frame"),
            eh_frame_hdr_svma: range(".eh_frame_hdr"),
            eh_frame_hdr: bytes(".eh_frame_hdr"),
            ..Default::default()
        };
        let (lo, hi) = m.range();
        unwinder.add_module(Module::new(
            m.path.display().to_string(),
            lo as u64..hi as u64,
            m.bias as u64,
            info,
        ));
    }
    State {
        unwinder,
        cache: CacheNative::new(),
        stack: stack_range(),
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(never)]
fn regs() -> (u64, u64, u64) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads rip, rsp and rbp; touches nothing else.
    unsafe {
        core::arch::asm!("lea {ip}, [rip]", "mov {sp}, rsp", "mov {bp}, rbp",
            ip = out(reg) ip, sp = out(reg) sp, bp = out(reg) bp);
    }
    (ip, sp, bp)
}

/// AArch64: `(pc, sp, x29, x30)` of this leaf, which keeps no frame (the
/// return address into its caller still in `x30`, its `sp` and `x29` the
/// caller's).
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
extern "C" fn regs_a64(out: *mut [u64; 4]) {
    // SAFETY: stores pc, sp, x29 and x30 into `*out`; touches nothing else.
    core::arch::naked_asm!(
        "adr x1, .",
        "mov x2, sp",
        "stp x1, x2, [x0]",
        "stp x29, x30, [x0, #16]",
        "ret",
    )
}

/// The first frame is `capture_with` at the return address from
/// `regs_a64` (a naked function has no CFI of its own).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
fn native_regs() -> (u64, UnwindRegsAarch64) {
    let mut r = [0u64; 4];
    regs_a64(&mut r);
    (r[3], UnwindRegsAarch64::new(r[3], r[1], r[2]))
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn native_regs() -> (u64, UnwindRegsX86_64) {
    let (ip, sp, bp) = regs();
    (ip, UnwindRegsX86_64::new(ip, sp, bp))
}

pub fn capture_with(st: &mut State, out: &mut [usize]) -> usize {
    let (ip, regs) = native_regs();
    let (lo, hi) = st.stack;
    let mut read = |a: u64| {
        if a >= lo && a + 8 <= hi && a % 8 == 0 {
            // SAFETY: inside this thread's stack.
            Ok(unsafe { *(a as *const u64) })
        } else {
            Err(())
        }
    };
    let mut it = st.unwinder.iter_frames(ip, regs, &mut st.cache, &mut read);
    let mut n = 0;
    while n < out.len() {
        match it.next() {
            Ok(Some(f)) => {
                out[n] = f.address() as usize;
                n += 1;
            }
            _ => break,
        }
    }
    n
}

#[inline(never)]
pub fn capture(out: &mut [usize]) -> usize {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let st = s.get_or_insert_with(setup);
        capture_with(st, out)
    })
}
