//! Kimi K2 calls: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX
//! <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>`.

use super::tagged::Markers;

pub static MARKERS: Markers = Markers {
    open: "<|tool_call_begin|>",
    close: "<|tool_call_end|>",
    ignore: &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"],
    read,
};

fn read(body: &str) -> Option<(String, String)> {
    let (id, args) = body.split_once("<|tool_call_argument_begin|>")?;
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = id.rsplit_once(':').map_or(id, |(n, _)| n).to_string();
    let args = args.trim();
    serde_json::from_str::<serde_json::Value>(args).ok()?;
    (!name.is_empty()).then(|| (name, args.to_string()))
}
