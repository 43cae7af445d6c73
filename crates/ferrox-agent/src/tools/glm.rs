//! GLM-4.5 to 4.7 calls: `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>VALUE</arg_value>
//! ...</tool_call>`. Values that parse as JSON (other than strings) are taken as JSON, the
//! rest as strings.

use serde_json::{Map, Value};

use super::tagged::{xml_value, Markers};

pub static MARKERS: Markers = Markers {
    open: "<tool_call>",
    close: "</tool_call>",
    ignore: &[],
    read,
};

fn read(body: &str) -> Option<(String, String)> {
    let name_end = body.find("<arg_key>").unwrap_or(body.len());
    let name = body[..name_end].trim().to_string();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let mut rest = &body[name_end..];
    let mut args = Map::new();
    while let Some(k) = rest.find("<arg_key>") {
        let after = &rest[k + "<arg_key>".len()..];
        let k_end = after.find("</arg_key>")?;
        let key = after[..k_end].trim().to_string();
        let after = &after[k_end + "</arg_key>".len()..];
        let v = after.find("<arg_value>")?;
        let value = &after[v + "<arg_value>".len()..];
        let v_end = value.find("</arg_value>").unwrap_or(value.len());
        args.insert(key, xml_value(&value[..v_end]));
        rest = &value[(v_end + "</arg_value>".len()).min(value.len())..];
    }
    Some((name, Value::Object(args).to_string()))
}
