//! Loads a relocatable eBPF object (`clang -O2 -target bpf -c prog.c`) into what the VM
//! runs: one text of instructions, the read-only data it refers to, the entry point and
//! the functions it calls. Relocations are applied here (no linker needed): a call to an
//! external symbol becomes a call of the helper of that name (refused if there is none),
//! a call to a function of the program an internal call, and a 64-bit load of a
//! constant's address the address where its data is mapped. Anything else is refused with
//! the reason.

use crate::ProgError;
use object::{
    Architecture, Object, ObjectKind, ObjectSection, ObjectSymbol, RelocationFlags,
    RelocationTarget, SectionKind, SymbolSection,
};
use solana_sbpf::ebpf;
use std::collections::BTreeMap;

/// Where the program's constants are mapped (read-only).
pub const RODATA_VM_ADDR: u64 = ebpf::MM_REGION_SIZE * 6;

/// The name of the entry point.
pub const ENTRY: &str = "spindle_main";

/// Instructions a program may have (a 512 KiB text): what a query kernel needs, with
/// room; the verifier and the JIT work in time linear in it.
pub const INSTRUCTIONS_MAX: usize = 64 * 1024;

/// Bytes of constants a program may have.
pub const RODATA_BYTES_MAX: usize = 4 << 20;

/// A relocated program.
#[derive(Clone, Debug)]
pub struct Image {
    /// The instructions, 8 bytes each.
    pub text: Vec<u8>,
    /// The constants, mapped at [`RODATA_VM_ADDR`].
    pub rodata: Vec<u8>,
    /// The entry point (instruction index).
    pub entry_pc: usize,
    /// Instruction index of every function called inside the program (internal calls).
    pub functions: Vec<usize>,
    /// The helpers the program calls, by name.
    pub helpers_used: Vec<String>,
}

// ELF relocation types of the BPF target (LLVM's BPF backend).
const R_BPF_64_64: u32 = 1;
const R_BPF_64_ABS64: u32 = 2;
const R_BPF_64_ABS32: u32 = 3;
const R_BPF_64_32: u32 = 10;

const OP_CALL: u8 = ebpf::CALL_IMM;
const OP_CALLX: u8 = ebpf::CALL_REG;
const OP_LDDW: u8 = ebpf::LD_DW_IMM;

/// The key a call instruction carries for an internal call to `pc` (as the VM's legacy
/// loader hashes it).
pub fn function_key(pc: usize) -> u32 {
    ebpf::hash_symbol_name(&pc.to_le_bytes())
}

/// The key a call instruction carries for helper `name`.
pub fn helper_key(name: &str) -> u32 {
    ebpf::hash_symbol_name(name.as_bytes())
}

fn bad(msg: impl Into<String>) -> ProgError {
    ProgError::Object(msg.into())
}

/// Loads `bytes`, an eBPF relocatable object; `helpers` are the names programs may call.
pub fn load(bytes: &[u8], helpers: &[&str]) -> Result<Image, ProgError> {
    let file = object::File::parse(bytes).map_err(|e| bad(format!("not an ELF object: {e}")))?;
    if file.architecture() != Architecture::Bpf {
        return Err(bad(format!(
            "not an eBPF object (architecture {:?}; build with clang -target bpf)",
            file.architecture()
        )));
    }
    if !file.is_little_endian() || !file.is_64() {
        return Err(bad("not a little-endian 64-bit eBPF object"));
    }
    if file.kind() != ObjectKind::Relocatable {
        return Err(bad(format!(
            "not a relocatable object ({:?}): give the output of `clang -c`",
            file.kind()
        )));
    }

    // Lay out the sections: code into one text, constants into one read-only blob.
    let mut text = Vec::new();
    let mut rodata = Vec::new();
    let mut text_base: BTreeMap<usize, usize> = BTreeMap::new();
    let mut ro_base: BTreeMap<usize, usize> = BTreeMap::new();
    for s in file.sections() {
        let name = s.name().unwrap_or("?").to_string();
        match s.kind() {
            SectionKind::Text => {
                let data = s.data().map_err(|e| bad(format!("section {name}: {e}")))?;
                if data.is_empty() {
                    continue;
                }
                if data.len() % ebpf::INSN_SIZE != 0 {
                    return Err(bad(format!("section {name}: not whole instructions")));
                }
                text_base.insert(s.index().0, text.len());
                text.extend_from_slice(data);
            }
            SectionKind::ReadOnlyData | SectionKind::ReadOnlyString => {
                let data = s.data().map_err(|e| bad(format!("section {name}: {e}")))?;
                while rodata.len() % 8 != 0 {
                    rodata.push(0);
                }
                ro_base.insert(s.index().0, rodata.len());
                rodata.extend_from_slice(data);
            }
            SectionKind::Data | SectionKind::UninitializedData | SectionKind::Tls
                if s.size() > 0 =>
            {
                return Err(bad(format!(
                    "section {name}: global variables that are written are not supported \
                     (make them const, or use the stack or spindle_alloc)"
                )));
            }
            _ => {}
        }
    }
    if text.is_empty() {
        return Err(bad("no code"));
    }
    if text.len() / ebpf::INSN_SIZE > INSTRUCTIONS_MAX {
        return Err(bad(format!(
            "{} instructions, at most {INSTRUCTIONS_MAX}",
            text.len() / ebpf::INSN_SIZE
        )));
    }
    if rodata.len() > RODATA_BYTES_MAX {
        return Err(bad(format!(
            "{} bytes of constants, at most {RODATA_BYTES_MAX}",
            rodata.len()
        )));
    }

    // Where a symbol is: (in the text, instruction byte offset) or (in constants, offset).
    enum At {
        Text(usize),
        Ro(usize),
    }
    let locate = |sym_section: SymbolSection, value: u64| -> Option<At> {
        let SymbolSection::Section(i) = sym_section else {
            return None;
        };
        if let Some(b) = text_base.get(&i.0) {
            return Some(At::Text(b + value as usize));
        }
        ro_base.get(&i.0).map(|b| At::Ro(b + value as usize))
    };

    let entry = file
        .symbols()
        .find(|s| s.name() == Ok(ENTRY) && s.is_definition())
        .ok_or_else(|| bad(format!("no function {ENTRY}")))?;
    let entry_pc = match locate(entry.section(), entry.address()) {
        Some(At::Text(off)) => off / ebpf::INSN_SIZE,
        _ => return Err(bad(format!("{ENTRY} is not code"))),
    };

    let mut functions: Vec<usize> = Vec::new();
    let mut helpers_used: Vec<String> = Vec::new();
    // Calls already relocated (their instruction offsets), to tell them from pc-relative
    // calls the compiler resolved itself.
    let mut relocated_calls: std::collections::BTreeSet<usize> = Default::default();
    let insn_count = text.len() / ebpf::INSN_SIZE;
    for s in file.sections() {
        let section_name = s.name().unwrap_or("?").to_string();
        let in_text = text_base.get(&s.index().0).copied();
        let in_ro = ro_base.get(&s.index().0).copied();
        for (offset, rel) in s.relocations() {
            let RelocationFlags::Elf { r_type } = rel.flags() else {
                return Err(bad("a relocation that is not ELF"));
            };
            let RelocationTarget::Symbol(si) = rel.target() else {
                return Err(bad(format!(
                    "section {section_name}: relocation without symbol"
                )));
            };
            let sym = file
                .symbol_by_index(si)
                .map_err(|e| bad(format!("section {section_name}: {e}")))?;
            let sym_name = sym.name().unwrap_or("?").to_string();
            let at = offset as usize;
            match (in_text, in_ro) {
                (Some(base), _) => {
                    let off = base + at;
                    if off + ebpf::INSN_SIZE > text.len() {
                        return Err(bad(format!("relocation past the code at {off}")));
                    }
                    let opcode = text[off];
                    match r_type {
                        R_BPF_64_32 if opcode == OP_CALL => {
                            if sym.is_undefined() {
                                if !helpers.contains(&sym_name.as_str()) {
                                    return Err(ProgError::UnknownHelper(sym_name));
                                }
                                set_imm(&mut text, off, helper_key(&sym_name) as i32);
                                set_src(&mut text, off, 0);
                                if !helpers_used.contains(&sym_name) {
                                    helpers_used.push(sym_name);
                                }
                            } else {
                                let Some(At::Text(t)) = locate(sym.section(), sym.address()) else {
                                    return Err(bad(format!(
                                        "call of {sym_name}, which is not code"
                                    )));
                                };
                                // The addend (the instruction's immediate) counts
                                // instructions past the symbol, minus the call itself.
                                let imm = imm(&text, off) as i64;
                                let target = (t / ebpf::INSN_SIZE) as i64 + imm + 1;
                                let target = internal_target(target, insn_count, &sym_name)?;
                                set_imm(&mut text, off, function_key(target) as i32);
                                set_src(&mut text, off, 0);
                                functions.push(target);
                            }
                            relocated_calls.insert(off);
                        }
                        R_BPF_64_64 if opcode == OP_LDDW => {
                            if off + 2 * ebpf::INSN_SIZE > text.len() {
                                return Err(bad("a 64-bit load cut short"));
                            }
                            let addend = imm(&text, off) as u32 as u64;
                            let addr = match locate(sym.section(), sym.address()) {
                                Some(At::Ro(o)) => RODATA_VM_ADDR + o as u64 + addend,
                                Some(At::Text(_)) => {
                                    return Err(bad(format!(
                                        "the address of function {sym_name} is taken: function \
                                         pointers are not supported"
                                    )))
                                }
                                None => {
                                    return Err(bad(format!(
                                        "a load of the address of {sym_name}, which is not a \
                                         constant of the program"
                                    )))
                                }
                            };
                            set_imm(&mut text, off, addr as u32 as i32);
                            set_imm(&mut text, off + ebpf::INSN_SIZE, (addr >> 32) as u32 as i32);
                        }
                        _ => {
                            return Err(bad(format!(
                                "relocation type {r_type} against {sym_name} on instruction \
                                 {:#04x} is not supported",
                                opcode
                            )))
                        }
                    }
                }
                (None, Some(base)) => {
                    // Pointers inside constants (tables of strings).
                    let off = base + at;
                    let width = match r_type {
                        R_BPF_64_ABS64 => 8,
                        R_BPF_64_ABS32 => 4,
                        _ => {
                            return Err(bad(format!(
                                "relocation type {r_type} in constants is not supported"
                            )))
                        }
                    };
                    let Some(At::Ro(o)) = locate(sym.section(), sym.address()) else {
                        return Err(bad(format!(
                            "constants point at {sym_name}, which is not a constant"
                        )));
                    };
                    if off + width > rodata.len() {
                        return Err(bad("relocation past the constants"));
                    }
                    let mut addend = [0u8; 8];
                    addend[..width].copy_from_slice(&rodata[off..off + width]);
                    let addr = RODATA_VM_ADDR + o as u64 + u64::from_le_bytes(addend);
                    if width == 4 && addr > u32::MAX as u64 {
                        return Err(bad("a 32-bit pointer cannot hold a constant's address"));
                    }
                    rodata[off..off + width].copy_from_slice(&addr.to_le_bytes()[..width]);
                }
                (None, None) => {} // debug information and the like
            }
        }
    }

    // The rest of the calls: the compiler's own pc-relative calls (src 1) become internal
    // calls; any other call (an immediate the program chose) is refused; so is callx.
    for pc in 0..insn_count {
        let off = pc * ebpf::INSN_SIZE;
        let opcode = text[off];
        if opcode == OP_CALLX {
            return Err(ProgError::Verify(format!(
                "instruction {pc}: calls through a register are not supported"
            )));
        }
        if opcode != OP_CALL || relocated_calls.contains(&off) {
            continue;
        }
        let src = text[off + 1] >> 4;
        if src != 1 {
            return Err(ProgError::UnknownHelper(format!(
                "#{} (a call by number at instruction {pc}; call helpers by name)",
                imm(&text, off)
            )));
        }
        let target = pc as i64 + 1 + imm(&text, off) as i64;
        let target = internal_target(target, insn_count, "a local function")?;
        set_imm(&mut text, off, function_key(target) as i32);
        set_src(&mut text, off, 0);
        functions.push(target);
    }
    // Skip the second half of every lddw when checking: done by the VM's verifier.
    functions.sort_unstable();
    functions.dedup();
    Ok(Image {
        text,
        rodata,
        entry_pc,
        functions,
        helpers_used,
    })
}

fn internal_target(target: i64, insn_count: usize, what: &str) -> Result<usize, ProgError> {
    if target < 0 || target as usize >= insn_count {
        return Err(ProgError::Verify(format!(
            "a call of {what} outside the program (instruction {target})"
        )));
    }
    Ok(target as usize)
}

fn imm(text: &[u8], off: usize) -> i32 {
    i32::from_le_bytes([text[off + 4], text[off + 5], text[off + 6], text[off + 7]])
}

fn set_imm(text: &mut [u8], off: usize, v: i32) {
    text[off + 4..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn set_src(text: &mut [u8], off: usize, src: u8) {
    text[off + 1] = (text[off + 1] & 0x0f) | (src << 4);
}
