//! Qwen3-Coder's XML calls: `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>
//! ...</function>\n</tool_call>`. Values that parse as JSON (numbers, booleans, arrays,
//! objects) are taken as JSON, the rest as strings.

use serde_json::{Map, Value};

use super::tagged::{xml_value, Markers};

pub static MARKERS: Markers = Markers {
    open: "<tool_call>",
    close: "</tool_call>",
    ignore: &[],
    read,
};

fn read(body: &str) -> Option<(String, String)> {
    let rest = body.trim_start().strip_prefix("<function=")?;
    let end = rest.find('>')?;
    let name = rest[..end].trim().to_string();
    let mut rest = &rest[end + 1..];
    if let Some(at) = rest.rfind("</function>") {
        rest = &rest[..at];
    }
    let mut args = Map::new();
    while let Some(start) = rest.find("<parameter=") {
        let after = &rest[start + "<parameter=".len()..];
        let close = after.find('>')?;
        let key = after[..close].trim().to_string();
        let value_start = &after[close + 1..];
        let value_end = value_start
            .find("</parameter>")
            .unwrap_or(value_start.len());
        args.insert(key, xml_value(&value_start[..value_end]));
        rest = &value_start[(value_end + "</parameter>".len()).min(value_start.len())..];
    }
    (!name.is_empty()).then(|| (name, Value::Object(args).to_string()))
}
