//! libnftables, the library inside the `nft` program, loaded at run time with dlopen.
//!
//! Running a batch in-process takes about 0.4 ms here; spawning `nft` for it takes about 4 ms
//! (see the README's benchmark), most of an ADD. It is loaded at run time, not linked, so the
//! plugin builds without libnftables' headers and still works (through the `nft` program) on a
//! node where the library is missing. Debian's `nftables` package depends on `libnftables1`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::mem::transmute;
use std::sync::{Mutex, OnceLock};

type Ctx = c_void;

type CtxNew = unsafe extern "C" fn(c_uint) -> *mut Ctx;
type CtxFree = unsafe extern "C" fn(*mut Ctx);
type SetFlags = unsafe extern "C" fn(*mut Ctx, c_uint);
type Buffer = unsafe extern "C" fn(*mut Ctx) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut Ctx) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut Ctx, *const c_char) -> c_int;

/// The libnftables calls we use (`nftables/libnftables.h`, stable since nftables 0.9).
struct Api {
    ctx_new: CtxNew,
    ctx_free: CtxFree,
    output_set_flags: SetFlags,
    buffer_output: Buffer,
    buffer_error: Buffer,
    get_output_buffer: GetBuffer,
    get_error_buffer: GetBuffer,
    run_cmd_from_buffer: RunCmd,
}

/// `NFT_CTX_OUTPUT_JSON`: JSON output, and JSON input for `nft_run_cmd_from_buffer`.
const OUTPUT_JSON: c_uint = 1 << 4;

pub struct Libnftables {
    api: Api,
}

/// The library's one-time global set-up inside `nft_ctx_new` is not thread-safe, and the
/// proxy calls from many threads: one context at a time.
static CALLS: Mutex<()> = Mutex::new(());

impl Libnftables {
    /// The process-wide instance, or `None` when libnftables cannot be loaded.
    pub fn get() -> Option<&'static Libnftables> {
        static LOADED: OnceLock<Option<Libnftables>> = OnceLock::new();
        LOADED.get_or_init(Libnftables::load).as_ref()
    }

    fn load() -> Option<Libnftables> {
        // SAFETY: dlopen/dlsym with NUL-terminated names. The handle is never closed, so the
        // function pointers stay valid for the life of the process. Each symbol is cast to the
        // signature the header declares for it.
        unsafe {
            let handle = libc::dlopen(
                c"libnftables.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_LOCAL,
            );
            if handle.is_null() {
                return None;
            }
            let symbol = |name: &CStr| {
                let ptr = libc::dlsym(handle, name.as_ptr());
                (!ptr.is_null()).then_some(ptr)
            };
            Some(Libnftables {
                api: Api {
                    ctx_new: transmute::<*mut c_void, CtxNew>(symbol(c"nft_ctx_new")?),
                    ctx_free: transmute::<*mut c_void, CtxFree>(symbol(c"nft_ctx_free")?),
                    output_set_flags: transmute::<*mut c_void, SetFlags>(symbol(
                        c"nft_ctx_output_set_flags",
                    )?),
                    buffer_output: transmute::<*mut c_void, Buffer>(symbol(
                        c"nft_ctx_buffer_output",
                    )?),
                    buffer_error: transmute::<*mut c_void, Buffer>(symbol(
                        c"nft_ctx_buffer_error",
                    )?),
                    get_output_buffer: transmute::<*mut c_void, GetBuffer>(symbol(
                        c"nft_ctx_get_output_buffer",
                    )?),
                    get_error_buffer: transmute::<*mut c_void, GetBuffer>(symbol(
                        c"nft_ctx_get_error_buffer",
                    )?),
                    run_cmd_from_buffer: transmute::<*mut c_void, RunCmd>(symbol(
                        c"nft_run_cmd_from_buffer",
                    )?),
                },
            })
        }
    }

    /// Runs `command` (JSON, or `nft` syntax such as `list ruleset`) with JSON output, in the
    /// calling thread's network namespace. `Ok` holds the output, `Err` the error text.
    pub fn run(&self, command: &str) -> Result<String, String> {
        let command = CString::new(command).map_err(|e| e.to_string())?;
        let _one_at_a_time = CALLS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let api = &self.api;
        // SAFETY: the context is created, used and freed here only; the buffers it returns are
        // copied before it is freed.
        unsafe {
            let ctx = (api.ctx_new)(0);
            if ctx.is_null() {
                return Err("nft_ctx_new failed".into());
            }
            (api.output_set_flags)(ctx, OUTPUT_JSON);
            (api.buffer_output)(ctx);
            (api.buffer_error)(ctx);
            let rc = (api.run_cmd_from_buffer)(ctx, command.as_ptr());
            let text = |ptr: *const c_char| {
                if ptr.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(ptr).to_string_lossy().into_owned()
                }
            };
            let result = if rc == 0 {
                Ok(text((api.get_output_buffer)(ctx)))
            } else {
                Err(text((api.get_error_buffer)(ctx)))
            };
            (api.ctx_free)(ctx);
            result
        }
    }
}
