//! `ferrox run`: generate a continuation of a prompt.

use std::io::Write;

use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

use ferrox_agent::{ConstraintCompiler, GrammarSpec};
use ferrox_generate::draft_model::{check_vocab_compatible, DraftParams, ModelDrafter};
use ferrox_generate::generate::{
    generate_speculative, Constraint, Draft, GenerationParams, Outcome,
};
use ferrox_generate::sampling::SamplerParams;
use ferrox_models::Engine;
use ferrox_models::EngineExt;
use ferrox_tokenizer::tokenizer::Tokenizer;
use serde_json::json;

use super::model::{self, ModelArgs};
use super::InputError;
use ferrox_generate::media::MediaPrompt;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt.
    #[arg(
        short = 'p',
        long,
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from this file (UTF-8, used as it is).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// Tokens to generate (-1: until end of generation or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 128,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculation: SpecArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
    /// Stop when this text is generated (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// With --json: the K most likely alternatives of each generated token.
    #[arg(long = "top-logprobs", default_value_t = 0)]
    pub top_logprobs: usize,
    /// Do not add the model's BOS token to the prompt.
    #[arg(long)]
    pub no_bos: bool,
    #[command(flatten)]
    pub vision: VisionArgs,
}

/// Images in the prompt (llama.cpp's `--mmproj` / `--image`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct VisionArgs {
    /// The model's vision projector (an `mmproj` GGUF), needed for --image.
    #[arg(long = "mmproj", value_name = "FILE")]
    pub mmproj: Option<std::path::PathBuf>,
    /// An image for the prompt (repeatable): each goes where the prompt says `<__media__>`,
    /// or before the text when it does not.
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<std::path::PathBuf>,
    /// With -hf: do not fetch the repository's vision projector.
    #[arg(long = "no-mmproj")]
    pub no_mmproj: bool,
    #[command(flatten)]
    pub image_tokens: super::model::ImageTokenArgs,
}

impl VisionArgs {
    /// The projector: --mmproj, else with -hf the repository's (unless --no-mmproj).
    pub fn projector(&self, model: &ModelArgs) -> anyhow::Result<Option<std::path::PathBuf>> {
        match (&self.mmproj, &model.hf_repo) {
            (Some(path), _) => Ok(Some(path.clone())),
            (None, Some(repo)) if !self.no_mmproj => super::models::resolve_hf_mmproj(repo),
            _ => Ok(None),
        }
    }

    /// The encoded images, each ready for `engine`'s prompt (none without --image).
    pub fn encode(
        &self,
        model: &ModelArgs,
        engine: &ferrox_models::AnyEngine,
    ) -> anyhow::Result<Vec<Arc<ferrox_generate::media::EncodedImage>>> {
        if self.images.is_empty() {
            return Ok(Vec::new());
        }
        let Some(path) = self.projector(model)? else {
            return Err(InputError(
                "--image needs --mmproj FILE (the model's vision projector GGUF)".into(),
            )
            .into());
        };
        let encoder = model::open_vision(&path, engine, &self.image_tokens)?;
        self.images
            .iter()
            .map(|p| model::encode_image_file(&encoder, p))
            .collect()
    }
}

/// Constrained output flags shared by `run` and `chat` (llama.cpp's names): the generated
/// text follows a GBNF grammar or a JSON schema.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct GrammarArgs {
    /// A GBNF grammar (llama.cpp's syntax; the start rule is `root`).
    #[arg(long = "grammar", value_name = "GBNF", conflicts_with_all = ["grammar_file", "json_schema"])]
    pub grammar: Option<String>,
    /// A file holding a GBNF grammar (llama.cpp's `grammars/*.gbnf`).
    #[arg(
        long = "grammar-file",
        value_name = "PATH",
        conflicts_with = "json_schema"
    )]
    pub grammar_file: Option<std::path::PathBuf>,
    /// A JSON schema the output must be an instance of (`{}`: any JSON).
    #[arg(long = "json-schema", value_name = "SCHEMA")]
    pub json_schema: Option<String>,
}

impl GrammarArgs {
    /// What the flags ask for.
    pub fn spec(&self) -> anyhow::Result<Option<GrammarSpec>> {
        let gbnf = |text: String, flag: &str| -> anyhow::Result<Option<GrammarSpec>> {
            // Read before the model loads, so a typo fails fast.
            ferrox_agent::gbnf::gbnf_to_lark(&text)
                .map_err(|e| InputError(format!("{flag}: {e}")))?;
            Ok(Some(GrammarSpec::Gbnf(text)))
        };
        if let Some(g) = &self.grammar {
            return gbnf(g.clone(), "--grammar");
        }
        if let Some(path) = &self.grammar_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| InputError(format!("--grammar-file {}: {e}", path.display())))?;
            return gbnf(text, &format!("--grammar-file {}", path.display()));
        }
        if let Some(schema) = &self.json_schema {
            let value: serde_json::Value = serde_json::from_str(schema)
                .map_err(|e| InputError(format!("--json-schema is not JSON: {e}")))?;
            return Ok(Some(GrammarSpec::JsonSchema(value)));
        }
        Ok(None)
    }

    /// The compiled constraint, if the flags ask for one; a bad grammar or schema is an
    /// input error naming the problem.
    pub fn constraint(
        &self,
        tokenizer: &Arc<Tokenizer>,
        n_vocab: usize,
    ) -> anyhow::Result<Option<Constraint>> {
        let Some(spec) = self.spec()? else {
            return Ok(None);
        };
        let compiler = ConstraintCompiler::new(tokenizer.clone(), n_vocab)
            .context("preparing the vocabulary for constrained output")?;
        let constraint = compiler
            .compile(&spec)
            .map_err(|e| InputError(e.to_string()))?;
        Ok(Some(constraint))
    }
}

/// How long drafts may be (llama.cpp's names), for every kind of speculation and command.
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct DraftLengthArgs {
    /// Most tokens drafted per step.
    #[arg(
        long = "draft-max",
        visible_alias = "spec-draft-n-max",
        default_value_t = 16
    )]
    pub draft_max: usize,
    /// Fewest tokens worth checking (shorter drafts are not checked).
    #[arg(
        long = "draft-min",
        visible_alias = "spec-draft-n-min",
        default_value_t = 1
    )]
    pub draft_min: usize,
}

impl DraftLengthArgs {
    /// The draft settings with a draft model's `p_min`, checked.
    pub fn params(self, p_min: f32) -> anyhow::Result<DraftParams> {
        let params = DraftParams {
            max: self.draft_max,
            min: self.draft_min,
            p_min,
        };
        params.validate().map_err(|e| InputError(e.to_string()))?;
        Ok(params)
    }
}

/// Speculative decoding flags shared by `run` and `chat` (llama.cpp's names). The output is
/// the same with or without: drafted tokens are checked, several per step.
#[derive(clap::Args, Clone, Debug)]
pub struct SpecArgs {
    /// `ngram`: prompt lookup (the tokens that followed the latest earlier occurrence of the
    /// text's last 1-4 tokens); `draft`: a draft model (--model-draft); `draft-mtp` (or
    /// `mtp`): the model's own multi-token-prediction block (`nextn_predict_layers`);
    /// `none`: plain decoding. Default: `draft` with --model-draft, else `none`.
    #[arg(long = "spec-type", visible_alias = "spec", value_enum)]
    pub spec_type: Option<SpecType>,
    /// A draft model for speculative decoding (`-md`): a smaller GGUF with the target's
    /// vocabulary, proposing tokens the target checks.
    #[arg(
        long = "model-draft",
        visible_alias = "spec-draft-model",
        value_name = "FILE"
    )]
    pub model_draft: Option<PathBuf>,
    #[command(flatten)]
    pub lengths: DraftLengthArgs,
    /// A draft model stops proposing at a token it gives less than this probability.
    #[arg(
        long = "draft-p-min",
        visible_alias = "spec-draft-p-min",
        default_value_t = 0.75
    )]
    pub draft_p_min: f32,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecType {
    None,
    Ngram,
    Draft,
    #[value(alias = "mtp")]
    DraftMtp,
}

/// The kind of speculation `--spec-type` and `--model-draft` ask for together: `draft`
/// when only a draft model is given; contradictions are input errors.
fn spec_kind(spec_type: Option<SpecType>, model_draft: bool) -> anyhow::Result<SpecType> {
    match (spec_type, model_draft) {
        (None, true) => Ok(SpecType::Draft),
        (None, false) => Ok(SpecType::None),
        (Some(SpecType::Draft), false) => {
            Err(InputError("--spec-type draft needs --model-draft FILE".into()).into())
        }
        (Some(SpecType::Draft), true) => Ok(SpecType::Draft),
        (Some(kind), true) => {
            let name = match kind {
                SpecType::None => "none",
                SpecType::Ngram => "ngram",
                _ => "draft-mtp",
            };
            Err(InputError(format!("--model-draft is given but --spec-type is {name}")).into())
        }
        (Some(kind), false) => Ok(kind),
    }
}

/// A loaded draft model and how much it proposes.
pub struct DraftModel {
    pub loaded: model::LoadedEngine,
    pub params: DraftParams,
}

impl DraftModel {
    /// A drafter for a target with `target_vocab` logits per row.
    pub fn drafter(
        &self,
        target_vocab: usize,
        sampler: &SamplerParams,
    ) -> anyhow::Result<ModelDrafter<'_>> {
        Ok(ModelDrafter::new(
            &self.loaded.engine,
            self.params,
            target_vocab,
            sampler.seed,
        )?)
    }
}

impl SpecArgs {
    /// The kind of speculation the flags ask for; contradictions and bad values are input
    /// errors.
    pub fn kind(&self) -> anyhow::Result<SpecType> {
        let kind = spec_kind(self.spec_type, self.model_draft.is_some())?;
        if kind != SpecType::None {
            self.draft_params()?;
        }
        Ok(kind)
    }

    fn draft_params(&self) -> anyhow::Result<DraftParams> {
        self.lengths.params(self.draft_p_min)
    }

    /// Prompt lookup's or the multi-token-prediction block's settings, when the flags ask
    /// for them.
    pub fn draft(&self) -> Draft {
        let (min, max) = (self.lengths.draft_min, self.lengths.draft_max);
        match self.kind() {
            Ok(SpecType::Ngram) => Draft::NGram { min, max },
            Ok(SpecType::DraftMtp) => Draft::Mtp { min, max },
            _ => Draft::None,
        }
    }

    /// The target's model flags, asking for its multi-token-prediction block when the
    /// flags draft with it.
    pub fn target_args(&self, model: &ModelArgs) -> anyhow::Result<ModelArgs> {
        Ok(ModelArgs {
            mtp: self.kind()? == SpecType::DraftMtp,
            ..model.clone()
        })
    }

    /// Readies the engine's memory to forget as many rejected draft tokens as a draft may
    /// hold ([`Engine::enable_rollback`]), and refuses speculation where it cannot (a
    /// recurrent state collapses its history; rings hold a few positions more than they
    /// need; Kimi-K3 checkpoints a step's last few positions).
    pub fn prepare_engine(&self, engine: &mut impl Engine) -> anyhow::Result<()> {
        if self.kind()? == SpecType::None {
            return Ok(());
        }
        let reach = engine.enable_rollback(self.lengths.draft_max)?;
        let arch = engine.architecture();
        if self.kind()? == SpecType::DraftMtp && !engine.has_mtp() {
            return Err(InputError(format!(
                "--spec-type draft-mtp: {arch} has no multi-token-prediction block to draft with"
            ))
            .into());
        }
        match reach {
            0 => Err(InputError(format!(
                "speculative decoding needs a model whose memory rolls back; {arch} keeps a recurrent state that cannot forget rejected draft tokens"
            ))
            .into()),
            reach if reach < self.lengths.draft_max => Err(InputError(format!(
                "{arch} can forget at most {reach} rejected draft tokens; use --draft-max {reach} or less"
            ))
            .into()),
            _ => Ok(()),
        }
    }

    /// Loads the draft model the flags name, with the target's threads, context size and
    /// cache settings, and checks its vocabulary against the target's tokenizer.
    pub fn load_draft(
        &self,
        target: &ModelArgs,
        target_tokenizer: &Tokenizer,
    ) -> anyhow::Result<Option<DraftModel>> {
        if self.kind()? != SpecType::Draft {
            return Ok(None);
        }
        let path = self.model_draft.clone().expect("checked by kind()");
        Ok(Some(DraftModel {
            loaded: load_draft_model(target, path, target_tokenizer)?,
            params: self.draft_params()?,
        }))
    }
}

/// Loads a draft model with the target's threads, context size and cache settings, and
/// checks its vocabulary against the target's tokenizer.
fn load_draft_model(
    target: &ModelArgs,
    path: PathBuf,
    target_tokenizer: &Tokenizer,
) -> anyhow::Result<model::LoadedEngine> {
    let args = ModelArgs {
        model: Some(path.clone()),
        hf_repo: None,
        mtp: false,
        ..target.clone()
    };
    let loaded = model::load_generator(&args).context("loading the draft model")?;
    check_vocab_compatible(target_tokenizer, &loaded.tokenizer).map_err(|e| {
        InputError(format!(
            "the draft model {} cannot draft for this model: {e}",
            path.display()
        ))
    })?;
    Ok(loaded)
}

/// [`load_draft_model`]'s engine (what `serve` needs).
pub fn load_draft_engine(
    target: &ModelArgs,
    path: PathBuf,
    target_tokenizer: &Tokenizer,
) -> anyhow::Result<ferrox_models::AnyEngine> {
    Ok(load_draft_model(target, path, target_tokenizer)?.engine)
}

/// Sampler flags shared by `run` and `chat` (llama.cpp's names and defaults).
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: fixed, so runs repeat).
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let defaults = SamplerParams::default();
        let params = SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            logit_bias: Vec::new(),
            seed: self.seed.unwrap_or(defaults.seed),
        };
        params.validate().map_err(InputError)?;
        Ok(params)
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let sampler = args.sampling.params()?;
    args.grammar.spec()?;
    args.speculation.kind()?;
    let mut loaded = model::load_generator(&args.speculation.target_args(&args.model)?)?;
    args.speculation.prepare_engine(&mut loaded.engine)?;
    let draft_model = args
        .speculation
        .load_draft(&args.model, &loaded.tokenizer)?;
    let tokenizer = Arc::new(loaded.tokenizer);
    let decoder = &loaded.engine;
    let mut drafter = match &draft_model {
        Some(d) => Some(d.drafter(decoder.vocab_size(), &sampler)?),
        None => None,
    };
    let constraint = args.grammar.constraint(&tokenizer, decoder.vocab_size())?;
    let tokenizer = &*tokenizer;
    let text = prompt_text(&args)?;
    let images = args.vision.encode(&args.model, decoder)?;
    let media = MediaPrompt::build(tokenizer, &text, images, !args.no_bos)
        .map_err(|e| InputError(e.to_string()))?;
    let all_ids = media.ids();
    if all_ids.is_empty() {
        return Err(
            InputError("the prompt is empty (and the model adds no BOS token)".into()).into(),
        );
    }
    let ctx = decoder.context_size();
    if all_ids.len() >= ctx {
        return Err(InputError(format!(
            "the prompt has {} tokens but the context holds {ctx}: use a larger --ctx-size",
            all_ids.len()
        ))
        .into());
    }
    let params = GenerationParams {
        max_tokens: usize::try_from(args.n_predict).ok(),
        stop: args.stop.clone(),
        sampler,
        top_logprobs: args.top_logprobs,
        logprobs: false,
        ignore_eog: false,
        draft: args.speculation.draft(),
        constraint,
        preserve: Vec::new(),
    };
    let mut state = decoder.new_state()?;
    // Text and images before the last piece of text go in first; generation follows that.
    let prompt = media
        .feed_prefix(decoder, &mut state)
        .context("evaluating the prompt's images")?;
    let start_pos = state.len();
    let mut stdout = std::io::stdout().lock();
    let mut top_logprobs = Vec::new();
    let mut write_error = None;
    let outcome = generate_speculative(
        decoder,
        &mut state,
        start_pos,
        tokenizer,
        &prompt,
        &params,
        drafter.as_mut(),
        |step| {
            if args.json {
                top_logprobs.push(
                    step.top_logprobs
                        .iter()
                        .map(|&(id, lp)| json!([id, lp]))
                        .collect::<Vec<_>>(),
                );
                return true;
            }
            if let Err(e) = stdout
                .write_all(step.text.as_bytes())
                .and_then(|_| stdout.flush())
            {
                write_error = Some(e);
                return false;
            }
            true
        },
    )
    .context("generation failed")?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    if args.json {
        let mut object = json!({
            "prompt_tokens": all_ids,
            "tokens": outcome.tokens,
            "text": outcome.text,
            "finish_reason": outcome.finish.as_str(),
            "timings": timings_json(&outcome),
        });
        if args.top_logprobs > 0 {
            object["top_logprobs"] = json!(top_logprobs);
        }
        serde_json::to_writer(&mut stdout, &object)?;
        writeln!(stdout)?;
    } else {
        writeln!(stdout)?;
        print_timings(&outcome);
    }
    let t = &outcome.timings;
    model::report_streamed_experts(decoder, t.prompt_tokens + t.generated_tokens);
    Ok(())
}

pub fn timings_json(outcome: &Outcome) -> serde_json::Value {
    let t = &outcome.timings;
    json!({
        "prompt_n": t.prompt_tokens,
        "prompt_ms": t.prompt_time.as_secs_f64() * 1e3,
        "prompt_per_second": t.prompt_tokens_per_second(),
        "predicted_n": t.generated_tokens,
        "predicted_ms": t.generation_time.as_secs_f64() * 1e3,
        "predicted_per_second": t.generation_tokens_per_second(),
        "draft_n": t.drafted_tokens,
        "draft_n_accepted": t.accepted_tokens,
    })
}

pub fn print_timings(outcome: &Outcome) {
    let t = &outcome.timings;
    eprintln!(
        "prompt: {} tokens in {:.1} ms ({:.2} t/s); generated: {} tokens in {:.1} ms ({:.2} t/s); finish: {}",
        t.prompt_tokens,
        t.prompt_time.as_secs_f64() * 1e3,
        t.prompt_tokens_per_second(),
        t.generated_tokens,
        t.generation_time.as_secs_f64() * 1e3,
        t.generation_tokens_per_second(),
        outcome.finish.as_str()
    );
}

/// The prompt: `-p TEXT`, or the contents of `-f FILE`.
fn prompt_text(args: &Args) -> anyhow::Result<String> {
    if let Some(p) = &args.prompt {
        return Ok(p.clone());
    }
    let path = args.file.as_ref().expect("clap requires -p or -f");
    let bytes = std::fs::read(path).map_err(|e| InputError(format!("{}: {e}", path.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        InputError(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
        .into()
    })
}
