//! ABI v1 byte plumbing: copy JSON into a guest's memory, call an export, copy the answer out. The
//! only code that touches guest memory; every pointer and length from the guest is bounds-checked.

use wasmtime::{AsContext, AsContextMut, Instance, Memory, TypedFunc};

use crate::policy::error::EvalError;

pub const ABI_VERSION: i32 = 1;
pub const EXPORT_MEMORY: &str = "memory";
pub const EXPORT_VERSION: &str = "slotgate_abi_version";
pub const EXPORT_ALLOC: &str = "slotgate_alloc";
pub const EXPORT_EVALUATE: &str = "slotgate_evaluate";
pub const EXPORT_VALIDATE: &str = "slotgate_validate_settings";
pub const EXPORT_ON_COMPLETE: &str = "slotgate_on_complete";
pub const IMPORT_MODULE: &str = "slotgate";
/// The custom section in which a policy names itself (the Rust SDK writes its crate's name).
pub const SECTION_NAME: &str = "slotgate.policy";

/// The name a module gives itself in its `slotgate.policy` custom section (wasm or WAT bytes),
/// when it has one that is a usable name (printable, at most 128 bytes).
pub fn declared_name(bytes: &[u8]) -> Option<String> {
    let wasm = wat::parse_bytes(bytes).ok()?;
    let mut at = 8;
    while at < wasm.len() {
        let id = wasm[at];
        let (size, next) = leb128(&wasm, at + 1)?;
        let end = next.checked_add(size)?;
        let section = wasm.get(next..end)?;
        if id == 0 {
            let (len, start) = leb128(section, 0)?;
            let name = section.get(start..start.checked_add(len)?)?;
            if name == SECTION_NAME.as_bytes() {
                let value = std::str::from_utf8(&section[start + len..]).ok()?;
                let usable = !value.is_empty()
                    && value.len() <= 128
                    && value.bytes().all(|b| b.is_ascii_graphic());
                return usable.then(|| value.to_owned());
            }
        }
        at = end;
    }
    None
}

/// An unsigned LEB128 number at `at`: its value and where it ends.
fn leb128(b: &[u8], mut at: usize) -> Option<(usize, usize)> {
    let (mut value, mut shift) = (0usize, 0);
    loop {
        let byte = *b.get(at)?;
        at += 1;
        value |= usize::from(byte & 0x7f).checked_shl(shift)?;
        if byte < 0x80 {
            return Some((value, at));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

pub fn memory(store: impl AsContextMut, instance: &Instance) -> Result<Memory, EvalError> {
    instance
        .get_memory(store, EXPORT_MEMORY)
        .ok_or_else(|| EvalError::Abi("the module exports no `memory`".into()))
}

/// Writes `input` into guest memory (allocated by the guest) and calls `export(ptr, len) -> i64`.
/// Returns the output bytes, or `None` when the guest returned 0.
pub fn call_json(
    mut store: impl AsContextMut,
    instance: &Instance,
    export: &str,
    input: &[u8],
    max_output: usize,
) -> Result<Option<Vec<u8>>, wasmtime::Error> {
    let call = Call::new(&mut store, instance, export, input)?;
    let ptr = call.alloc.call(&mut store, call.len)?;
    write_input(&mut store, &call.mem, ptr, input)?;
    let packed = call.func.call(&mut store, (ptr, call.len))?;
    output(&store, &call.mem, packed, max_output)
}

/// [`call_json`] with the calls made on a fiber, so the deadline check may yield to the async
/// executor (`Runs::Async` in `sandbox.rs`).
pub async fn call_json_async<T: Send>(
    mut store: impl AsContextMut<Data = T>,
    instance: &Instance,
    export: &str,
    input: &[u8],
    max_output: usize,
) -> Result<Option<Vec<u8>>, wasmtime::Error> {
    let call = Call::new(&mut store, instance, export, input)?;
    let ptr = call.alloc.call_async(&mut store, call.len).await?;
    write_input(&mut store, &call.mem, ptr, input)?;
    let packed = call.func.call_async(&mut store, (ptr, call.len)).await?;
    output(&store, &call.mem, packed, max_output)
}

/// What a [`call_json`] needs from the instance before it calls: the guest's memory, its allocator,
/// the export, and the input's length as the guest takes it.
struct Call {
    mem: Memory,
    alloc: TypedFunc<i32, i32>,
    func: TypedFunc<(i32, i32), i64>,
    len: i32,
}

impl Call {
    fn new(
        mut store: impl AsContextMut,
        instance: &Instance,
        export: &str,
        input: &[u8],
    ) -> Result<Call, wasmtime::Error> {
        let mem = memory(&mut store, instance).map_err(wasmtime::Error::new)?;
        let alloc = instance.get_typed_func::<i32, i32>(&mut store, EXPORT_ALLOC)?;
        let len = i32::try_from(input.len())
            .map_err(|_| wasmtime::Error::new(EvalError::Abi("input too large".into())))?;
        let func = instance.get_typed_func::<(i32, i32), i64>(&mut store, export)?;
        Ok(Call {
            mem,
            alloc,
            func,
            len,
        })
    }
}

fn write_input(
    mut store: impl AsContextMut,
    mem: &Memory,
    ptr: i32,
    input: &[u8],
) -> Result<(), wasmtime::Error> {
    if ptr == 0 {
        return Err(wasmtime::Error::new(EvalError::Abi(
            "slotgate_alloc returned 0".into(),
        )));
    }
    mem.write(&mut store, ptr as u32 as usize, input)
        .map_err(|_| {
            wasmtime::Error::new(EvalError::Abi(
                "slotgate_alloc returned memory out of bounds".into(),
            ))
        })
}

/// The output an export's packed `(ptr << 32) | len` answer points at; `None` for 0.
fn output(
    store: impl AsContext,
    mem: &Memory,
    packed: i64,
    max_output: usize,
) -> Result<Option<Vec<u8>>, wasmtime::Error> {
    if packed == 0 {
        return Ok(None);
    }
    let (out_ptr, out_len) = (
        (packed as u64 >> 32) as usize,
        (packed as u64 & 0xffff_ffff) as usize,
    );
    if out_len > max_output {
        return Err(wasmtime::Error::new(EvalError::InvalidOutput(format!(
            "output of {out_len} bytes is over the {max_output}-byte limit"
        ))));
    }
    read(&store, mem, out_ptr, out_len)
        .map(Some)
        .map_err(wasmtime::Error::new)
}

/// Copies `len` bytes at `ptr` out of guest memory.
pub fn read(
    store: impl AsContext,
    mem: &Memory,
    ptr: usize,
    len: usize,
) -> Result<Vec<u8>, EvalError> {
    let data = mem.data(&store);
    ptr.checked_add(len)
        .and_then(|end| data.get(ptr..end))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            EvalError::InvalidOutput(format!("pointer {ptr}+{len} is outside the guest's memory"))
        })
}
