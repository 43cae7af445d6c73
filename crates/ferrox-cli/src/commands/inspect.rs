//! `ferrox inspect FILE [--json]`: what a GGUF file holds.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use ferrox_gguf::{GgmlType, Gguf, Value};
use serde_json::{json, Map, Value as Json};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (the first file of a split checkpoint).
    file: PathBuf,
    /// Print one JSON object: {"metadata": {...}, "tensors": [{name, type, shape, offset, bytes}]}.
    #[arg(long)]
    json: bool,
    /// Print arrays whole instead of summarizing long ones.
    #[arg(long)]
    full_arrays: bool,
    /// Print the memory plan instead: what loading the file would pack into memory, leave
    /// in the file, and stream through the experts' cache (under `--memory-budget`, else
    /// the default budget on this machine).
    #[arg(long)]
    plan: bool,
    /// The budget the plan is made for (see `run --memory-budget`).
    #[arg(long = "memory-budget", value_parser = super::model::byte_size, value_name = "SIZE", requires = "plan")]
    memory_budget: Option<u64>,
}

/// Arrays longer than this are summarized as type, length and first items.
const ARRAY_SUMMARY_ITEMS: usize = 8;

pub fn run(args: Args) -> anyhow::Result<()> {
    let gguf = super::open_gguf(&args.file)?;
    let limit = if args.full_arrays {
        usize::MAX
    } else {
        ARRAY_SUMMARY_ITEMS
    };
    let mut out = std::io::stdout().lock();
    if args.plan {
        return print_plan(&mut out, &gguf, args.memory_budget, args.json);
    }
    if args.json {
        serde_json::to_writer(&mut out, &to_json(&gguf, limit))?;
        writeln!(out)?;
    } else {
        print_text(&mut out, &args.file, &gguf, limit)?;
    }
    Ok(())
}

/// The memory planner's decision for this file, as text or JSON.
fn print_plan(
    out: &mut impl Write,
    gguf: &Gguf,
    memory_budget: Option<u64>,
    json: bool,
) -> anyhow::Result<()> {
    let options = ferrox_models::EngineOptions {
        memory_budget,
        ..Default::default()
    };
    let plan = ferrox_models::plan::MemoryPlan::new(gguf, &options)?;
    use ferrox_models::plan::ExpertPlacement;
    let (experts, slots, slot_bytes) = match plan.experts {
        ExpertPlacement::Packed => ("packed", 0, 0),
        ExpertPlacement::Streamed { slots, slot_bytes } => ("streamed", slots, slot_bytes),
        ExpertPlacement::Mapped => ("mapped", 0, 0),
    };
    if json {
        let object = json!({
            "budget": plan.budget,
            "budget_given": plan.budget_given,
            "dense_bytes": plan.dense_bytes,
            "growing_in_place": plan.growing_in_place(),
            "expert_bytes": plan.expert_bytes,
            "expert_packed_bytes": plan.expert_packed_bytes,
            "experts": experts,
            "expert_cache_slots": slots,
            "expert_slot_bytes": slot_bytes,
            "mapped_bytes": plan.mapped_bytes(),
            "kv_reserved_bytes": plan.kv_reserved,
        });
        serde_json::to_writer(&mut *out, &object)?;
        writeln!(out)?;
        return Ok(());
    }
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    let source = if plan.budget_given {
        "given".to_string()
    } else {
        format!(
            "85% of the memory available now, less {} for one sequence's KV cache over the \
             whole context",
            gib(plan.kv_reserved)
        )
    };
    writeln!(out, "budget:          {} ({source})", gib(plan.budget))?;
    writeln!(
        out,
        "resident:        {} (every tensor but the routed experts)",
        gib(plan.dense_bytes)
    )?;
    if plan.growing_in_place() {
        writeln!(
            out,
            "                 (matrices whose packed form is over {:.0}% larger than the \
             file's, such as TQ1_0's, kept as the file stores them: packed, the rest would not \
             fit)",
            (ferrox_models::plan::GROWTH_LIMIT - 1.0) * 100.0
        )?;
    }
    writeln!(
        out,
        "routed experts:  {} in the file, {} packed",
        gib(plan.expert_bytes),
        gib(plan.expert_packed_bytes)
    )?;
    match plan.experts {
        ExpertPlacement::Packed => writeln!(out, "experts:         packed into memory at load")?,
        ExpertPlacement::Streamed { .. } => writeln!(
            out,
            "experts:         streamed from the file through a cache of {slots} experts ({})",
            gib(slots as u64 * slot_bytes)
        )?,
        ExpertPlacement::Mapped => {
            writeln!(out, "experts:         read in place from the mapped file")?
        }
    }
    writeln!(out, "mapped:          {}", gib(plan.mapped_bytes()))?;
    Ok(())
}

fn float_json(f: f64) -> Json {
    serde_json::Number::from_f64(f)
        .map(Json::Number)
        .unwrap_or_else(|| Json::String(f.to_string()))
}

/// f32 values print by their shortest decimal form (1e-6, not 9.99999997e-7).
fn f32_json(f: f32) -> Json {
    float_json(f.to_string().parse().unwrap_or(f64::NAN))
}

fn value_json(v: &Value<'_>, limit: usize) -> Json {
    match *v {
        Value::U8(x) => x.into(),
        Value::I8(x) => x.into(),
        Value::U16(x) => x.into(),
        Value::I16(x) => x.into(),
        Value::U32(x) => x.into(),
        Value::I32(x) => x.into(),
        Value::U64(x) => x.into(),
        Value::I64(x) => x.into(),
        Value::F32(x) => f32_json(x),
        Value::F64(x) => float_json(x),
        Value::Bool(x) => x.into(),
        Value::String(s) => s.into(),
        Value::Array(a) => {
            let items: Vec<Json> = a
                .iter()
                .take(limit)
                .map(|x| value_json(&x, limit))
                .collect();
            if a.len() <= limit {
                Json::Array(items)
            } else {
                json!({"type": "array", "elem_type": a.elem_type().name(), "len": a.len(), "head": items})
            }
        }
    }
}

fn to_json(gguf: &Gguf, limit: usize) -> Json {
    let metadata: Map<String, Json> = gguf
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), value_json(&v, limit)))
        .collect();
    let tensors: Vec<Json> = gguf
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.shape,
                "offset": t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    json!({
        "version": gguf.version(),
        "metadata": metadata,
        "tensors": tensors,
    })
}

/// A value as one line of text: strings quoted and escaped, long arrays summarized.
fn value_text(v: &Value<'_>, limit: usize) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::F32(x) => x.to_string(),
        Value::Array(a) => {
            let items: Vec<String> = a
                .iter()
                .take(limit)
                .map(|x| value_text(&x, limit))
                .collect();
            let more = if a.len() > items.len() { ", ..." } else { "" };
            format!(
                "[{}; {}] [{}{more}]",
                a.elem_type(),
                a.len(),
                items.join(", ")
            )
        }
        other => value_json(other, limit).to_string(),
    }
}

fn print_text(
    out: &mut impl Write,
    path: &std::path::Path,
    gguf: &Gguf,
    limit: usize,
) -> anyhow::Result<()> {
    let meta = gguf.metadata();
    writeln!(
        out,
        "{}: GGUF v{}, {} bytes in {} file(s), alignment {}, data at offset {}",
        path.display(),
        gguf.version(),
        gguf.file_size(),
        gguf.shard_count(),
        gguf.alignment(),
        gguf.data_offset()
    )?;
    writeln!(
        out,
        "architecture: {}",
        meta.opt_str("general.architecture")
            .ok()
            .flatten()
            .unwrap_or("(none)")
    )?;
    writeln!(out, "\nmetadata ({} keys):", meta.len())?;
    for (key, value) in meta.iter() {
        let ty = match value {
            Value::Array(_) => "arr".to_string(),
            v => v.value_type().name().to_string(),
        };
        writeln!(out, "  {key:<48} {ty:<6} {}", value_text(&value, limit))?;
    }

    let tensors = gguf.tensors();
    writeln!(out, "\ntensors ({}):", tensors.len())?;
    let width = tensors
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        out,
        "  {:<width$}  {:<8}  {:<24}  {:>12}",
        "name", "type", "shape", "bytes"
    )?;
    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    let (mut params, mut bytes) = (0u64, 0u64);
    for t in tensors {
        let shape = format!("{:?}", t.shape);
        let size = t.n_bytes.map_or("?".to_string(), |b| b.to_string());
        writeln!(
            out,
            "  {:<width$}  {:<8}  {:<24}  {:>12}",
            t.name,
            t.ty.name(),
            shape,
            size
        )?;
        let entry = by_type.entry(t.ty).or_default();
        entry.0 += 1;
        entry.1 += t.n_elements;
        entry.2 += t.n_bytes.unwrap_or(0);
        params += t.n_elements;
        bytes += t.n_bytes.unwrap_or(0);
    }
    writeln!(
        out,
        "\ntotals: {} tensors, {} parameters ({:.2} M), {} bytes ({:.2} MiB)",
        tensors.len(),
        params,
        params as f64 / 1e6,
        bytes,
        bytes as f64 / (1 << 20) as f64
    )?;
    for (ty, (count, n, b)) in by_type {
        writeln!(
            out,
            "  {:<8} {count:>5} tensors {n:>12} parameters {b:>12} bytes",
            ty.name()
        )?;
    }
    Ok(())
}
