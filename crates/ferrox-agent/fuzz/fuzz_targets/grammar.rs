#![no_main]
//! What a request's `grammar` or `json_schema` goes through before the compiler sees it:
//! any text translates to Lark or to an error, any JSON value passes the depth check or is
//! refused, and neither panics, overflows the stack or takes long (libFuzzer's -timeout).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(lark) = ferrox_agent::gbnf::gbnf_to_lark(text) {
        assert!(!lark.is_empty());
    }
    if let Ok(schema) = serde_json::from_str::<serde_json::Value>(text) {
        let _ = ferrox_agent::schema_depth::check(&schema);
    }
});
