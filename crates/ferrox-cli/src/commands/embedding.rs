//! `ferrox embedding`: the embeddings of texts, as llama.cpp's `llama-embedding` computes
//! them (tokens with the model's special tokens, pooled, normalized).

use ferrox_generate::embedding::{embed_tokens, normalize, Pooling};
use ferrox_models::{Engine, EngineExt};
use serde_json::json;

use super::model::{self, ModelArgs};
use super::serve::pooling;
use super::InputError;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text; several texts are separated by --embd-separator (a newline by default).
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// What separates the texts of --prompt.
    #[arg(long = "embd-separator", default_value = "\n")]
    pub separator: String,
    /// How a text's token embeddings are pooled: none, mean, cls, last, or rank (the
    /// scores of a reranker's classification head; default: the file's `pooling_type`, none
    /// without one).
    #[arg(long, value_name = "TYPE", value_parser = pooling)]
    pub pooling: Option<Pooling>,
    /// -1: none, 0: to the int16 range, 1: taxicab, 2: Euclidean (default), >2: p-norm
    /// (pooled embeddings only, as llama.cpp).
    #[arg(
        long = "embd-normalize",
        default_value_t = 2,
        allow_negative_numbers = true
    )]
    pub normalize: i32,
    /// `json`: OpenAI's embeddings object; default: one line of values per embedding.
    #[arg(long = "embd-output-format", value_name = "FORMAT")]
    pub output_format: Option<String>,
    /// Tokens run together per pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.normalize < -1 {
        return Err(InputError("--embd-normalize must be -1 or more".into()).into());
    }
    let json_output = match args.output_format.as_deref() {
        None | Some("") => false,
        Some("json") => true,
        Some(other) => {
            return Err(InputError(format!("--embd-output-format {other}: only json")).into())
        }
    };
    let loaded = model::load_engine(&args.model)?;
    let (engine, tokenizer) = (&loaded.engine, &loaded.tokenizer);
    let pooling = match args.pooling {
        Some(p) => Ok(p),
        None => Pooling::of_model(engine),
    }
    .and_then(|p| p.check(engine))
    .map_err(|e| InputError(e.to_string()))?;
    let texts: Vec<&str> = args
        .prompt
        .split(args.separator.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    if texts.is_empty() {
        return Err(InputError("no text to embed".into()).into());
    }
    let mut state = engine.new_state()?;
    let mut data = Vec::with_capacity(texts.len());
    let mut prompt_tokens = 0;
    for text in texts {
        let tokens = tokenizer.encode(text, true, true);
        if tokens.len() > engine.context_size() {
            return Err(InputError(format!(
                "a text of {} tokens exceeds the context size ({}): give a larger --ctx-size",
                tokens.len(),
                engine.context_size()
            ))
            .into());
        }
        prompt_tokens += tokens.len();
        let mut vectors = embed_tokens(engine, &mut state, &tokens, pooling, args.batch)?;
        if !matches!(pooling, Pooling::None | Pooling::Rank) {
            vectors
                .iter_mut()
                .for_each(|v| normalize(v, args.normalize));
        }
        data.extend(vectors);
    }
    if json_output {
        let data: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(i, v)| json!({"object": "embedding", "index": i, "embedding": v}))
            .collect();
        let out = json!({
            "object": "list",
            "data": data,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        });
        println!("{out}");
    } else {
        for (i, v) in data.iter().enumerate() {
            let values: Vec<String> = v.iter().map(|x| format!("{x:.6}")).collect();
            println!("embedding {i}: {}", values.join(" "));
        }
    }
    Ok(())
}
