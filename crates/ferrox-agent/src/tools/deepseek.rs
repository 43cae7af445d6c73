//! DeepSeek calls. V3 and R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//! \n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`; V3.1 and later drop the type
//! and the fence: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`.

use super::tagged::Markers;

pub static MARKERS: Markers = Markers {
    open: "<｜tool▁call▁begin｜>",
    close: "<｜tool▁call▁end｜>",
    ignore: &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"],
    read,
};

fn read(body: &str) -> Option<(String, String)> {
    let (head, rest) = body.split_once("<｜tool▁sep｜>")?;
    let (name, args) = if head.trim() == "function" {
        let (name, args) = rest.split_once('\n')?;
        let args = args.trim();
        let args = args.strip_prefix("```json").unwrap_or(args);
        let args = args.trim_end().strip_suffix("```").unwrap_or(args);
        (name.trim(), args.trim())
    } else {
        (head.trim(), rest.trim())
    };
    serde_json::from_str::<serde_json::Value>(args).ok()?;
    (!name.is_empty()).then(|| (name.to_string(), args.to_string()))
}
