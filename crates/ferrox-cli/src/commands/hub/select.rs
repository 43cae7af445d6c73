//! Which files of a Hub repository `REPO[:QUANT]` means, as llama.cpp's `-hf` chooses them:
//! the GGUF whose name carries QUANT (default Q4_K_M, else the first GGUF), with every part
//! of a split checkpoint (`NAME-00001-of-0000N.gguf`).

use super::HubError;

/// The quantization chosen when the reference names none.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// `ORG/NAME[:QUANT]` as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef {
    pub repo: String,
    pub quant: Option<String>,
}

impl ModelRef {
    pub fn parse(s: &str) -> Result<ModelRef, HubError> {
        let (repo, quant) = match s.rsplit_once(':') {
            Some((repo, quant)) => (repo, Some(quant)),
            None => (s, None),
        };
        let valid_part = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        match repo.split_once('/') {
            Some((org, name)) if valid_part(org) && valid_part(name) => {}
            _ => {
                return Err(HubError::BadReference(format!(
                    "`{s}`: expected ORG/NAME[:QUANT], e.g. ggml-org/gemma-3-270m-GGUF:Q8_0"
                )))
            }
        }
        let quant = match quant {
            Some(q)
                if q.is_empty() || !q.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                return Err(HubError::BadReference(format!(
                    "`{s}`: `{q}` is not a quantization name (e.g. Q4_K_M, Q8_0)"
                )))
            }
            q => q.map(str::to_string),
        };
        Ok(ModelRef {
            repo: repo.to_string(),
            quant,
        })
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.quant {
            Some(q) => write!(f, "{}:{q}", self.repo),
            None => write!(f, "{}", self.repo),
        }
    }
}

/// Whether `name` carries `tag` as a whole word (case-insensitive): `Q4_K` is not in
/// `model-Q4_K_M.gguf`.
fn carries_tag(name: &str, tag: &str) -> bool {
    let (name, tag) = (name.to_ascii_uppercase(), tag.to_ascii_uppercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    name.match_indices(&tag).any(|(at, _)| {
        let before = name[..at].chars().next_back();
        let after = name[at + tag.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric()) && !word(after)
    })
}

/// `(prefix, index, count)` of a split part's file name (`NAME-00002-of-00003.gguf`).
pub fn split_part(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, index) = rest.rsplit_once('-')?;
    let digits = |t: &str| t.len() == 5 && t.bytes().all(|b| b.is_ascii_digit());
    if !(digits(index) && digits(count)) {
        return None;
    }
    Some((prefix, index.parse().ok()?, count.parse().ok()?))
}

/// The model files among a repository's: GGUFs that are not projectors for other modalities.
fn model_ggufs(files: &[String]) -> Vec<&String> {
    let mut ggufs: Vec<&String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .filter(|f| !f.to_ascii_lowercase().contains("mmproj"))
        .collect();
    ggufs.sort();
    ggufs
}

/// The files to fetch for `quant` among a repository's `files`, the first one the one to
/// open (a split checkpoint's first part).
pub fn select(files: &[String], quant: Option<&str>) -> Result<Vec<String>, HubError> {
    let ggufs = model_ggufs(files);
    if ggufs.is_empty() {
        return Err(HubError::NoGguf);
    }
    let wanted = quant.unwrap_or(DEFAULT_QUANT);
    let chosen = ggufs
        .iter()
        .find(|f| carries_tag(f, wanted))
        .or_else(|| quant.is_none().then(|| &ggufs[0]));
    let Some(chosen) = chosen else {
        return Err(HubError::NoQuant {
            quant: wanted.to_string(),
            available: available_quants(files),
        });
    };
    match split_part(chosen) {
        Some((prefix, _, count)) => {
            let parts: Vec<String> = (1..=count)
                .map(|i| format!("{prefix}-{i:05}-of-{count:05}.gguf"))
                .collect();
            if let Some(missing) = parts.iter().find(|p| !files.contains(p)) {
                return Err(HubError::MissingPart(missing.clone()));
            }
            Ok(parts)
        }
        None => Ok(vec![chosen.to_string()]),
    }
}

/// The vision projector (`mmproj`) to go with `model` among a repository's `files`, as
/// llama.cpp's `-hf` picks it: a GGUF whose name holds `mmproj`, in the model's directory or
/// one above it (the deepest first), then the one whose quantization's bits are nearest the
/// model's (`F16` 16, `Q8_0` 8, `Q4_K_M` 4), the first listed on a tie.
pub fn select_mmproj(files: &[String], model: &str) -> Option<String> {
    let model_dirs: Vec<&str> = model.split('/').collect();
    let model_dirs = &model_dirs[..model_dirs.len() - 1];
    let model_bits = quant_bits(model);
    let mut best: Option<(usize, u32, &String)> = None;
    for f in files {
        if !f.ends_with(".gguf") || !f.contains("mmproj") {
            continue;
        }
        let parts: Vec<&str> = f.split('/').collect();
        let dirs = &parts[..parts.len() - 1];
        if dirs.len() > model_dirs.len() || model_dirs[..dirs.len()] != *dirs {
            continue;
        }
        let diff = quant_bits(f).abs_diff(model_bits);
        let better = match best {
            None => true,
            Some((depth, best_diff, _)) => {
                dirs.len() > depth || (dirs.len() == depth && diff < best_diff)
            }
        };
        if better {
            best = Some((dirs.len(), diff, f));
        }
    }
    best.map(|(_, _, f)| f.clone())
}

/// The bits of a file name's quantization tag (its last `-` or `.` separated word): the
/// first number in it, 0 without one.
fn quant_bits(name: &str) -> u32 {
    let stem = name.strip_suffix(".gguf").unwrap_or(name);
    let stem = split_part(name).map_or(stem, |(prefix, _, _)| prefix);
    let tag = stem.rsplit(['-', '.']).next().unwrap_or_default();
    let is_word = !tag.is_empty() && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !is_word || tag.len() == stem.len() {
        return 0;
    }
    let digits: String = tag
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// The quantization names the repository's GGUFs carry, for an error message.
pub fn available_quants(files: &[String]) -> Vec<String> {
    const KNOWN: &[&str] = &[
        "F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M",
        "Q4_K_S", "Q4_1", "Q4_0", "IQ4_XS", "IQ4_NL", "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K",
    ];
    let ggufs = model_ggufs(files);
    let mut found: Vec<String> = KNOWN
        .iter()
        .filter(|q| ggufs.iter().any(|f| carries_tag(f, q)))
        .map(|q| q.to_string())
        .collect();
    if found.is_empty() {
        found = ggufs.iter().map(|f| f.to_string()).collect();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn references_parse_and_bad_ones_are_refused() {
        assert_eq!(
            ModelRef::parse("org/model-GGUF:Q8_0").unwrap(),
            ModelRef {
                repo: "org/model-GGUF".into(),
                quant: Some("Q8_0".into())
            }
        );
        assert_eq!(ModelRef::parse("org/m").unwrap().quant, None);
        for bad in [
            "model",
            "org/",
            "/m",
            "org/m:",
            "org/../x",
            "a/b/c",
            "org/m:Q4 K",
        ] {
            assert!(ModelRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_quant_is_matched_as_a_whole_word() {
        let repo = files(&[
            "README.md",
            "model-Q4_K_M.gguf",
            "model-Q4_K_S.gguf",
            "model-Q8_0.gguf",
            "mmproj-model-f16.gguf",
        ]);
        assert_eq!(select(&repo, None).unwrap(), ["model-Q4_K_M.gguf"]);
        assert_eq!(select(&repo, Some("q8_0")).unwrap(), ["model-Q8_0.gguf"]);
        match select(&repo, Some("Q4_K")) {
            Err(HubError::NoQuant { available, .. }) => {
                assert_eq!(available, ["Q8_0", "Q4_K_M", "Q4_K_S"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_the_default_quant_the_first_gguf_is_taken() {
        let repo = files(&["b-f16.gguf", "a-Q8_0.gguf", "config.json"]);
        assert_eq!(select(&repo, None).unwrap(), ["a-Q8_0.gguf"]);
        assert!(matches!(
            select(&files(&["config.json"]), None),
            Err(HubError::NoGguf)
        ));
    }

    #[test]
    fn the_projector_is_picked_as_llama_cpp_picks_it() {
        let repo = files(&[
            "gemma-3-4b-it-Q4_K_M.gguf",
            "mmproj-model-f16.gguf",
            "mmproj-model-Q8_0.gguf",
            "sub/mmproj-F32.gguf",
        ]);
        // Nearest bits: Q4_K_M (4) takes Q8_0 (8) over f16 (16).
        assert_eq!(
            select_mmproj(&repo, "gemma-3-4b-it-Q4_K_M.gguf").as_deref(),
            Some("mmproj-model-Q8_0.gguf")
        );
        assert_eq!(
            select_mmproj(&repo, "gemma-3-4b-it-F16.gguf").as_deref(),
            Some("mmproj-model-f16.gguf")
        );
        // A model in a directory takes that directory's projector first.
        assert_eq!(
            select_mmproj(&repo, "sub/gemma-Q4_K_M.gguf").as_deref(),
            Some("sub/mmproj-F32.gguf")
        );
        assert_eq!(
            select_mmproj(&files(&["model-Q4_0.gguf"]), "model-Q4_0.gguf"),
            None
        );
        assert_eq!(quant_bits("a-Q4_K_M-00001-of-00002.gguf"), 4);
        assert_eq!(quant_bits("mmproj.gguf"), 0);
    }

    #[test]
    fn split_checkpoints_are_fetched_whole() {
        let repo = files(&[
            "m-Q4_K_M-00002-of-00003.gguf",
            "m-Q4_K_M-00001-of-00003.gguf",
            "m-Q4_K_M-00003-of-00003.gguf",
        ]);
        assert_eq!(
            select(&repo, None).unwrap(),
            [
                "m-Q4_K_M-00001-of-00003.gguf",
                "m-Q4_K_M-00002-of-00003.gguf",
                "m-Q4_K_M-00003-of-00003.gguf"
            ]
        );
        let incomplete = files(&["m-Q4_K_M-00001-of-00002.gguf"]);
        assert!(matches!(
            select(&incomplete, None),
            Err(HubError::MissingPart(_))
        ));
    }
}
