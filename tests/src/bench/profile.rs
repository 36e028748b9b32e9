//! Where each BPF program's time goes, source line by source line: a
//! software-clock profile (`perf record -e cpu-clock -a`; these VMs have
//! no hardware counters) of a connect loop through a variant, its samples
//! inside the JITed programs attributed to source lines.
//!
//! A sample's address falls in one of a program's JITed functions
//! (`jited_ksyms`, `jited_func_lens` of `BPF_OBJ_GET_INFO_BY_FD`); the
//! program's JIT line info pairs each BTF line-info record (an instruction
//! of the verified program) with its JITed address, and bpftool's
//! `prog dump xlated linum` names the source line of each instruction.
//! The sample counts the last line-info record at or before its address.
//! Samples carry their call chains (`-g`; the JITed programs keep frame
//! pointers), so a sample inside a helper or kernel function a program
//! called (a hash lookup's body, a checksum, an LRU insert) counts for the
//! line of the call, named with the function (`line  -> function`). A
//! timer sample lands on the instruction the interrupt found, so a load
//! that missed the caches shows on itself or the instruction after it.
//!
//! `perf` comes from Debian's `linux-perf` (`cargo xtask setup`); without
//! it the profile is left out and the run says why.

use std::{
    collections::BTreeMap,
    fs,
    os::fd::OwnedFd,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::{env::Env, services::ServiceSet, traffic};
use crate::{
    bpf::{prog_fd_by_id, put, sys_bpf},
    netns::run,
};

/// Samples per second and CPU (each with its call chain).
const FREQUENCY: u32 = 10_000;
/// The report leaves out a program with fewer samples (it barely ran).
pub const MIN_SAMPLES: u64 = 20;
/// Source lines kept per program.
const LINES: usize = 8;

/// One program's samples, by source line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProgProfile {
    pub variant: String,
    pub program: String,
    /// Samples inside the program's JITed code (its BPF subprograms
    /// included).
    pub samples: u64,
    /// Every sample of the recording (all CPUs, idle included).
    pub total: u64,
    /// Connections of the profiled loop.
    #[serde(default)]
    pub connects: usize,
    /// Its hottest source lines (`file:line  source`), with their samples.
    pub lines: Vec<(String, u64)>,
}

/// Whether `perf` can record here.
pub fn available() -> bool {
    Command::new("perf")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Profiles `connects` connections to the service `set` targets last,
/// through `env`, and attributes the samples of the programs `ids`.
pub fn measure(
    env: &Env,
    set: &ServiceSet,
    ids: &BTreeMap<u64, String>,
    connects: usize,
    scratch: &Path,
) -> Result<Vec<ProgProfile>> {
    let data = scratch.join(format!("perf-{}.data", env.variant.name()));
    let target = vec![traffic::addr(
        set.vip(set.last),
        super::services::SERVICE_PORT,
    )];
    let recorder = Recorder::start(&data)?;
    let run = traffic::connects(env.client(), &target, 0, connects, Duration::MAX);
    recorder.stop()?;
    let run = run?;
    if run.errors > connects / 10 {
        bail!(
            "{} errors ({})",
            run.errors,
            run.first_error.unwrap_or_default()
        );
    }
    let (chains, total) = sample_chains(&data)?;
    let _ = fs::remove_file(&data);
    let mut out = Vec::new();
    for (&id, name) in ids {
        let (layout, sources) = match JitLayout::of(id).and_then(|l| Ok((l, xlated_sources(id)?))) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("  {} profile of {name}: {e:#}", env.variant.name());
                continue;
            }
        };
        let (samples, lines) = layout.attribute(&chains, &sources);
        if samples == 0 {
            continue;
        }
        let mut lines: Vec<_> = lines.into_iter().collect();
        lines.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        lines.truncate(LINES);
        out.push(ProgProfile {
            variant: env.variant.name().to_owned(),
            program: name.clone(),
            samples,
            total,
            connects,
            lines,
        });
    }
    Ok(out)
}

/// `perf record` over every CPU for as long as this lives.
struct Recorder {
    child: Child,
}

impl Recorder {
    fn start(data: &Path) -> Result<Self> {
        let child = Command::new("perf")
            .args(["record", "-e", "cpu-clock", "-a", "-g", "-q", "-F"])
            .arg(FREQUENCY.to_string())
            .arg("-o")
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting perf record")?;
        // perf maps its buffers on every CPU and lists the running
        // threads and programs before it records.
        std::thread::sleep(Duration::from_millis(1500));
        Ok(Self { child })
    }

    fn stop(mut self) -> Result<()> {
        // SAFETY: a signal to the child this value owns.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait()?;
        // perf raises the signal again once it wrote the file.
        use std::os::unix::process::ExitStatusExt;
        if !status.success() && status.signal() != Some(libc::SIGINT) {
            bail!("perf record: {status}");
        }
        Ok(())
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample's call chain, innermost first: (address, symbol).
type Chain = Vec<(u64, String)>;

/// The call chains of the samples in `data` that passed through a BPF
/// program, and how many samples there were in all.
fn sample_chains(data: &Path) -> Result<(Vec<Chain>, u64)> {
    let out = run(Command::new("perf")
        .args(["script", "--no-inline", "-F", "ip,sym", "-i"])
        .arg(data))?;
    Ok(parse_chains(&String::from_utf8_lossy(&out.stdout)))
}

/// `perf script -F ip,sym` of call-chain samples: one `ADDRESS SYMBOL`
/// line per frame, innermost first, a blank line after each sample. Only
/// chains through a BPF program (`bpf_prog_*`) are kept; all are counted.
fn parse_chains(text: &str) -> (Vec<Chain>, u64) {
    let mut out = Vec::new();
    let mut total = 0;
    let mut chain = Chain::new();
    let mut keep = |chain: Chain, out: &mut Vec<Chain>| {
        total += 1;
        if chain.iter().any(|(_, sym)| sym.starts_with("bpf_prog_")) {
            out.push(chain);
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            if !chain.is_empty() {
                keep(std::mem::take(&mut chain), &mut out);
            }
            continue;
        }
        let (addr, sym) = line.split_once(' ').unwrap_or((line, ""));
        if let Ok(addr) = u64::from_str_radix(addr, 16) {
            chain.push((addr, sym.trim().to_owned()));
        }
    }
    if !chain.is_empty() {
        keep(chain, &mut out);
    }
    (out, total)
}

/// Where a loaded program's JITed code lies, and which verified
/// instruction each line-info address begins.
#[derive(Debug, Default, PartialEq)]
struct JitLayout {
    /// (start, length) of each JITed function.
    funcs: Vec<(u64, u64)>,
    /// (JITed address, instruction index), sorted by address.
    lines: Vec<(u64, u32)>,
}

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `struct bpf_prog_info` up to `jited_line_info_rec_size` (uapi
/// `linux/bpf.h`); the kernel fills what the caller's length covers.
const INFO_LEN: usize = 184;
const OFF_NR_JITED_KSYMS: usize = 104;
const OFF_NR_JITED_FUNC_LENS: usize = 108;
const OFF_JITED_KSYMS: usize = 112;
const OFF_JITED_FUNC_LENS: usize = 120;
const OFF_NR_LINE_INFO: usize = 148;
const OFF_LINE_INFO: usize = 152;
const OFF_JITED_LINE_INFO: usize = 160;
const OFF_NR_JITED_LINE_INFO: usize = 168;
const OFF_LINE_INFO_REC_SIZE: usize = 172;
const OFF_JITED_LINE_INFO_REC_SIZE: usize = 176;

fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

impl JitLayout {
    fn of(id: u64) -> Result<Self> {
        let fd = prog_fd_by_id(id)?;
        let mut info = [0u8; INFO_LEN];
        info_by_fd(&fd, &mut info)?;
        let nksyms = get_u32(&info, OFF_NR_JITED_KSYMS) as usize;
        let nlens = get_u32(&info, OFF_NR_JITED_FUNC_LENS) as usize;
        let nline = get_u32(&info, OFF_NR_LINE_INFO) as usize;
        let njline = get_u32(&info, OFF_NR_JITED_LINE_INFO) as usize;
        let line_rec = get_u32(&info, OFF_LINE_INFO_REC_SIZE) as usize;
        let jline_rec = get_u32(&info, OFF_JITED_LINE_INFO_REC_SIZE) as usize;
        if nksyms == 0 || nline != njline || line_rec < 4 || jline_rec < 8 {
            bail!("no JIT line info (ksyms {nksyms}, line info {nline}/{njline})");
        }
        let mut ksyms = vec![0u8; 8 * nksyms];
        let mut lens = vec![0u8; 4 * nlens];
        let mut line_info = vec![0u8; line_rec * nline];
        let mut jited_lines = vec![0u8; jline_rec * njline];
        let mut info = [0u8; INFO_LEN];
        put(
            &mut info,
            OFF_NR_JITED_KSYMS,
            &(nksyms as u32).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_NR_JITED_FUNC_LENS,
            &(nlens as u32).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_JITED_KSYMS,
            &(ksyms.as_mut_ptr() as u64).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_JITED_FUNC_LENS,
            &(lens.as_mut_ptr() as u64).to_ne_bytes(),
        );
        put(&mut info, OFF_NR_LINE_INFO, &(nline as u32).to_ne_bytes());
        put(
            &mut info,
            OFF_LINE_INFO,
            &(line_info.as_mut_ptr() as u64).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_JITED_LINE_INFO,
            &(jited_lines.as_mut_ptr() as u64).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_NR_JITED_LINE_INFO,
            &(njline as u32).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_LINE_INFO_REC_SIZE,
            &(line_rec as u32).to_ne_bytes(),
        );
        put(
            &mut info,
            OFF_JITED_LINE_INFO_REC_SIZE,
            &(jline_rec as u32).to_ne_bytes(),
        );
        info_by_fd(&fd, &mut info)?;
        let u64_at = |b: &[u8], off: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[off..off + 8]);
            u64::from_ne_bytes(w)
        };
        let funcs = (0..nksyms.min(nlens))
            .map(|i| (u64_at(&ksyms, 8 * i), u64::from(get_u32(&lens, 4 * i))))
            .collect();
        let mut lines: Vec<(u64, u32)> = (0..nline)
            .map(|i| {
                (
                    u64_at(&jited_lines, jline_rec * i),
                    get_u32(&line_info, line_rec * i),
                )
            })
            .collect();
        lines.sort_unstable();
        Ok(Self { funcs, lines })
    }

    /// The samples of `chains` inside this program (its own code, or a
    /// function it called), and how many each source line took
    /// (`sources`: instruction index -> source line). A sample is the
    /// innermost program frame's: its own line, or the line of the call
    /// and the function called (`line  -> function`).
    fn attribute(
        &self,
        chains: &[Chain],
        sources: &BTreeMap<u32, String>,
    ) -> (u64, BTreeMap<String, u64>) {
        let mut total = 0;
        let mut by_line = BTreeMap::new();
        for chain in chains {
            let Some((depth, &(ip, _))) = chain
                .iter()
                .enumerate()
                .find(|(_, (ip, _))| self.func_of(*ip).is_some())
            else {
                continue;
            };
            total += 1;
            // A caller's frame holds the return address: the call is the
            // instruction before it.
            let at = if depth == 0 { ip } else { ip - 1 };
            let line = self.line_of(at, sources);
            let line = match depth {
                0 => line,
                _ => format!("{line}  -> {}", chain[depth - 1].1),
            };
            *by_line.entry(line).or_insert(0) += 1;
        }
        (total, by_line)
    }

    fn func_of(&self, ip: u64) -> Option<u64> {
        self.funcs
            .iter()
            .find(|(s, l)| ip >= *s && ip < s + l)
            .map(|&(s, _)| s)
    }

    fn line_of(&self, ip: u64, sources: &BTreeMap<u32, String>) -> String {
        let Some(start) = self.func_of(ip) else {
            return "(outside the program)".to_owned();
        };
        let i = self.lines.partition_point(|&(a, _)| a <= ip);
        match i.checked_sub(1).map(|i| self.lines[i]) {
            Some((addr, insn)) if addr >= start => sources
                .range(..=insn)
                .next_back()
                .map_or_else(|| format!("instruction {insn}"), |(_, s)| s.clone()),
            _ => "(before the first line record)".to_owned(),
        }
    }
}

fn info_by_fd(fd: &OwnedFd, info: &mut [u8; INFO_LEN]) -> Result<()> {
    use std::os::fd::AsRawFd;
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &(fd.as_raw_fd() as u32).to_ne_bytes());
    put(&mut attr, 4, &(INFO_LEN as u32).to_ne_bytes());
    put(&mut attr, 8, &(info.as_mut_ptr() as u64).to_ne_bytes());
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).context("BPF_OBJ_GET_INFO_BY_FD")?;
    Ok(())
}

/// Instruction index -> `file:line  source` of program `id`, from
/// bpftool's `prog dump xlated linum`.
fn xlated_sources(id: u64) -> Result<BTreeMap<u32, String>> {
    let out = run(Command::new("bpftool").args([
        "prog",
        "dump",
        "xlated",
        "id",
        &id.to_string(),
        "linum",
    ]))?;
    Ok(parse_xlated(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `prog dump xlated linum` text: a `; source [file:PATH
/// line_num:N line_col:C]` line names the source of the instructions
/// (`  IDX: ...`) after it.
fn parse_xlated(text: &str) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    // The last line of sluice's own code: a line of a library (aya's
    // helper wrappers, `core`) is named with it, as where it was called
    // from, most often.
    let mut own: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("; ") {
            let src = source_line(rest);
            if is_own(rest) {
                own = Some(src.split("  ").next().unwrap_or_default().to_owned());
                current = Some(src);
            } else {
                current = Some(match &own {
                    Some(own) => format!("{src}  (after {own})"),
                    None => src,
                });
            }
            continue;
        }
        let trimmed = line.trim_start();
        let Some((idx, _)) = trimmed.split_once(':') else {
            continue;
        };
        if let (Ok(idx), Some(src)) = (idx.parse::<u32>(), &current) {
            out.entry(idx).or_insert_with(|| src.clone());
        }
    }
    out
}

/// Whether a `prog dump xlated linum` source line is sluice's own code.
fn is_own(rest: &str) -> bool {
    rest.contains("/sluice-ebpf/src/") || rest.contains("/sluice-common/src/")
}

/// `source [file:PATH line_num:N line_col:C]` -> `FILE:N  source`, the
/// file named from its last `src/` on (`maps.rs`, `iter/range.rs`).
fn source_line(rest: &str) -> String {
    let Some((code, meta)) = rest.rsplit_once(" [file:") else {
        return rest.trim().to_owned();
    };
    let mut parts = meta.trim_end_matches(']').split_whitespace();
    let path = parts.next().unwrap_or("");
    let file = path.rsplit_once("/src/").map_or(path, |(_, f)| f);
    let line = parts
        .find_map(|p| p.strip_prefix("line_num:"))
        .unwrap_or("?");
    let code: String = code.trim().chars().take(80).collect();
    format!("{file}:{line}  {code}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const DUMP: &str = "\
i32 sl_connect4(struct bpf_sock_addr * ctx):
; #[cgroup_sock_addr(connect4)] [file:/work/main/ebpf/sluice-ebpf/src/main.rs line_num:197 line_col:0]
   0: (bf) r9 = r1
; proto == IPPROTO_TCP [file:/work/main/ebpf/sluice-ebpf/src/sock.rs line_num:498 line_col:9]
   1: (79) r8 = *(u64 *)(r9 +0)
   2: (18) r1 = map[id:4]
   4: (69) r8 = *(u16 *)(r8 +532)
; if self.start < self.end { [file:/usr/lib/rustlib/src/rust/library/core/src/iter/range.rs line_num:900 line_col:12]
   5: (95) exit
";

    #[test]
    fn xlated_lines_name_the_instructions_after_them() {
        let s = parse_xlated(DUMP);
        assert_eq!(s[&0], "main.rs:197  #[cgroup_sock_addr(connect4)]");
        assert_eq!(s[&1], "sock.rs:498  proto == IPPROTO_TCP");
        assert_eq!(s[&4], "sock.rs:498  proto == IPPROTO_TCP");
        assert_eq!(
            s[&5],
            "iter/range.rs:900  if self.start < self.end {  (after sock.rs:498)"
        );
        assert!(!s.contains_key(&3));
    }

    #[test]
    fn a_sample_counts_the_last_line_record_before_it_in_its_function() {
        let sources = parse_xlated(DUMP);
        let layout = JitLayout {
            funcs: vec![(1000, 100), (5000, 20)],
            lines: vec![(1000, 0), (1010, 1), (1050, 5), (5000, 4)],
        };
        let leaf = |ip: u64| vec![(ip, "bpf_prog".to_owned()), (1, "caller".to_owned())];
        let mut chains: Vec<Chain> = [999, 1000, 1009, 1010, 1049, 1050, 1099, 1100, 5010, 7000]
            .into_iter()
            .map(leaf)
            .collect();
        // Inside a kernel function the program called at 1010..1050: the
        // return address 1050 names the call's line, 1049.
        chains.push(vec![
            (42, "__htab_map_lookup_elem".to_owned()),
            (1050, "bpf_prog".to_owned()),
            (1, "caller".to_owned()),
        ]);
        // Not under the program at all.
        chains.push(vec![
            (42, "tcp_v4_rcv".to_owned()),
            (43, "ip_rcv".to_owned()),
        ]);
        let (n, by) = layout.attribute(&chains, &sources);
        assert_eq!(
            n, 8,
            "999, 1100, 7000 and the last chain are outside the program"
        );
        assert_eq!(by["main.rs:197  #[cgroup_sock_addr(connect4)]"], 2);
        assert_eq!(by["sock.rs:498  proto == IPPROTO_TCP"], 3);
        assert_eq!(
            by["iter/range.rs:900  if self.start < self.end {  (after sock.rs:498)"],
            2
        );
        assert_eq!(
            by["sock.rs:498  proto == IPPROTO_TCP  -> __htab_map_lookup_elem"],
            1
        );
    }

    #[test]
    fn chains_are_split_at_blank_lines() {
        let text = "\tffffffffc0026b70 bpf_prog_a_sl_ingress\n\tffffffff81eb6d67 __netif_receive_skb_core\n\n\tffffffff81531350 __htab_map_lookup_elem\n\t          101829 syscall\n\n\n\tffffffff81531350 __htab_map_lookup_elem\n\tffffffffc0028677 bpf_prog_b_sl_connect4\n";
        let (c, total) = parse_chains(text);
        assert_eq!(total, 3);
        assert_eq!(
            c.len(),
            2,
            "the chain through no program is counted, not kept"
        );
        assert_eq!(
            c[0][0],
            (0xffffffffc0026b70, "bpf_prog_a_sl_ingress".to_owned())
        );
        assert_eq!(c[0][1].1, "__netif_receive_skb_core");
        assert_eq!(
            c[1][1],
            (0xffffffffc0028677, "bpf_prog_b_sl_connect4".to_owned())
        );
    }
}
