//! How deeply compiling a JSON schema recurses, measured before it is compiled.
//!
//! llguidance compiles a schema by recursion: into each subschema, and through each `$ref`
//! the first time it is met (a reference met again, a cycle included, is a rule already
//! defined). Its own depth limit covers only `allOf` intersections, so a chain of 20,000
//! `$ref`s — a few hundred kilobytes of JSON — would overflow the compiling thread's stack
//! and abort the process. This walk follows the same path without recursion (an explicit
//! stack): subschemas in document order, each `$ref` target the first time it is reached,
//! and reports the deepest point. References are resolved within the document: JSON
//! pointers (`#/$defs/a`, relative to the nearest enclosing `$id`), anchors (`#name`) and
//! `$id`s; one it cannot resolve is left to the compiler, which refuses it.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// The deepest compilation a schema may need, in subschema levels (nesting and `$ref`
/// chains together). Request bodies nest at most 128 deep, so this admits any nesting and
/// long reference chains, and keeps the compiler's stack within a few megabytes.
pub const MAX_SCHEMA_DEPTH: usize = 256;

/// Keywords whose values are not subschemas (data, or definitions compiled only when a
/// `$ref` reaches them).
const NOT_SUBSCHEMAS: [&str; 7] = [
    "$defs",
    "definitions",
    "const",
    "enum",
    "default",
    "examples",
    "x-guidance",
];

/// Keywords whose values map names to subschemas.
const SCHEMA_MAPS: [&str; 4] = [
    "properties",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
];

/// Checks that compiling `schema` stays within [`MAX_SCHEMA_DEPTH`] levels.
pub fn check(schema: &Value) -> Result<(), String> {
    let index = Index::build(schema);
    let depth = index.deepest(schema);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "the JSON schema nests more than {MAX_SCHEMA_DEPTH} levels deep through its \
             subschemas and $ref chains"
        ));
    }
    Ok(())
}

type Node = *const Value;

/// Every object of the document with the resource (`$id`) it belongs to, and the names
/// references can use.
#[derive(Default)]
struct Index<'v> {
    /// The object that is the base resource of each object (the nearest `$id`, or the root).
    base: HashMap<Node, &'v Value>,
    /// `$id` values, as written, to their objects.
    ids: HashMap<&'v str, &'v Value>,
    /// The last path segment of each `$id` (relative references name it so).
    id_tails: HashMap<&'v str, &'v Value>,
    /// `$anchor` / `$dynamicAnchor` names to their objects.
    anchors: HashMap<&'v str, &'v Value>,
}

impl<'v> Index<'v> {
    fn build(root: &'v Value) -> Index<'v> {
        let mut index = Index::default();
        let mut stack: Vec<(&'v Value, &'v Value)> = vec![(root, root)];
        while let Some((value, base)) = stack.pop() {
            match value {
                Value::Object(map) => {
                    let id = map
                        .get("$id")
                        .or_else(|| map.get("id"))
                        .and_then(Value::as_str);
                    let base = match id {
                        Some(id) => {
                            let id = id.trim_end_matches('#');
                            index.ids.insert(id, value);
                            let tail = id.rsplit('/').next().unwrap_or(id);
                            index.id_tails.insert(tail, value);
                            value
                        }
                        None => base,
                    };
                    for key in ["$anchor", "$dynamicAnchor"] {
                        if let Some(name) = map.get(key).and_then(Value::as_str) {
                            index.anchors.insert(name, value);
                        }
                    }
                    index.base.insert(value as Node, base);
                    stack.extend(map.values().map(|v| (v, base)));
                }
                Value::Array(items) => stack.extend(items.iter().map(|v| (v, base))),
                _ => {}
            }
        }
        index
    }

    /// The object a `$ref` written in `from` names, if the document holds it.
    fn resolve(&self, from: &'v Value, reference: &str) -> Option<&'v Value> {
        let (resource, fragment) = match reference.split_once('#') {
            Some((uri, fragment)) => (uri, fragment),
            None => (reference, ""),
        };
        let resource = if resource.is_empty() {
            *self.base.get(&(from as Node))?
        } else {
            let tail = resource.rsplit('/').next().unwrap_or(resource);
            *self.ids.get(resource).or_else(|| self.id_tails.get(tail))?
        };
        if fragment.is_empty() {
            return Some(resource);
        }
        if !fragment.starts_with('/') {
            return self.anchors.get(fragment).copied();
        }
        let mut target = resource;
        for token in fragment[1..].split('/') {
            let token = percent_decode(token).replace("~1", "/").replace("~0", "~");
            target = match target {
                Value::Object(map) => map.get(&token)?,
                Value::Array(items) => items.get(token.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        target.is_object().then_some(target)
    }

    /// The deepest level the compiler's recursion reaches, from the root.
    fn deepest(&self, root: &'v Value) -> usize {
        let mut reached: HashSet<Node> = HashSet::new();
        let mut deepest = 0;
        // (object, its depth); children are pushed in reverse so that they are walked in
        // document order.
        let mut stack: Vec<(&'v Value, usize)> = vec![(root, 1)];
        while let Some((value, depth)) = stack.pop() {
            deepest = deepest.max(depth);
            if depth > MAX_SCHEMA_DEPTH {
                break;
            }
            let Value::Object(map) = value else { continue };
            let mut children: Vec<&'v Value> = Vec::new();
            for (key, child) in map {
                if key == "$ref" || key == "$dynamicRef" || key == "$recursiveRef" {
                    if let Some(target) = child.as_str().and_then(|r| self.resolve(value, r)) {
                        if reached.insert(target as Node) {
                            children.push(target);
                        }
                    }
                } else if SCHEMA_MAPS.contains(&key.as_str()) {
                    if let Value::Object(map) = child {
                        map.values()
                            .for_each(|schema| collect_objects(schema, &mut children));
                    }
                } else if !NOT_SUBSCHEMAS.contains(&key.as_str()) {
                    collect_objects(child, &mut children);
                }
            }
            stack.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
        }
        deepest
    }
}

/// The objects directly inside `value` (itself, or through arrays and keyword maps such as
/// `properties`, which the compiler walks without a level of its own).
fn collect_objects<'v>(value: &'v Value, out: &mut Vec<&'v Value>) {
    match value {
        Value::Object(_) => out.push(value),
        Value::Array(items) => {
            for item in items {
                if item.is_object() {
                    out.push(item);
                }
            }
        }
        _ => {}
    }
}

fn percent_decode(token: &str) -> String {
    if !token.contains('%') {
        return token.to_string();
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            if let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"$ref": format!("#/$defs/d{}", i + 1)})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn ordinary_and_recursive_schemas_pass() {
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            }}},
            "$ref": "#/$defs/node"
        });
        assert!(check(&tree).is_ok());
        assert!(check(&json!({"$ref": "#"})).is_ok());
        assert!(check(&ref_chain(200)).is_ok());
        assert!(check(&json!(true)).is_ok());
    }

    #[test]
    fn long_reference_chains_are_refused() {
        let e = check(&ref_chain(20_000)).unwrap_err();
        assert!(e.contains("256 levels"), "{e}");
        assert!(check(&ref_chain(MAX_SCHEMA_DEPTH + 5)).is_err());
    }

    #[test]
    fn chains_through_ids_and_anchors_are_followed() {
        let n = 1000;
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$id": format!("https://example.com/d{i}.json"),
                       "$anchor": format!("a{i}"),
                       "$ref": if i % 2 == 0 { format!("d{}.json", i + 1) }
                               else { format!("#a{}", i + 1) }}),
            );
        }
        let schema = json!({"$defs": defs, "$ref": "https://example.com/d0.json"});
        assert!(check(&schema).is_err());
    }

    #[test]
    fn pointers_decode_escapes() {
        let schema = json!({"$defs": {"a/b": {"type": "string"}, "c d": {"$ref": "#/$defs/a~1b"}},
                            "$ref": "#/$defs/c%20d"});
        let index = Index::build(&schema);
        let target = index.resolve(&schema, "#/$defs/c%20d").unwrap();
        assert_eq!(target, &json!({"$ref": "#/$defs/a~1b"}));
        assert_eq!(index.deepest(&schema), 3);
    }
}
