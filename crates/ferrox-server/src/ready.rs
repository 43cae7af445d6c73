//! What exists once the model is loaded ([`Ready`]) and how it is built: the chat
//! template, the KV pool, the grammar engine, the tool-call format, the draft model and the
//! scheduler.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use ferrox_agent::{ConstraintCompiler, ToolFormat};
use ferrox_generate::embedding::Pooling;
use ferrox_models::{AnyEngine, Engine};
use ferrox_tokenizer::chat_template::{ChatTemplate, RenderOptions};
use ferrox_tokenizer::tokenizer::{TokenId, Tokenizer};

use crate::draft::DraftModel;
use crate::kv::{self, KvPool};
use crate::metrics::{Metrics, ServedModel};
use crate::scheduler::{Scheduler, SchedulerOptions};
use crate::{unix_time, ApiError, LoadedModel, ReasoningFormat, ServerConfig};

/// Everything that exists once the model is loaded.
pub(crate) struct Ready {
    pub model_id: String,
    pub model_path: String,
    /// Names a request's `model` may use.
    pub accepted_ids: Vec<String>,
    pub created: u64,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub render_options: RenderOptions,
    /// Stop strings chat requests get from the template: end-of-turn markers it prints that
    /// the vocabulary does not know as end-of-generation tokens (ChatML on a model without
    /// `<|im_end|>`).
    pub template_stops: Vec<String>,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub slots: usize,
    /// Blocks of [`kv::BLOCK_TOKENS`] positions in the sequence memory.
    pub kv_blocks: usize,
    /// The KV cache's element type, as vLLM and SGLang spell it.
    pub cache_dtype: String,
    pub scheduler: Scheduler,
    /// Compiles grammars and schemas against the vocabulary (`None` inside when it could
    /// not be built: constrained requests are then refused).
    pub compiler: GrammarEngine,
    /// How the model writes tool calls (from its template).
    pub tool_format: ToolFormat,
    /// The control tokens among the format's markers (rendered in tool-call output).
    pub tool_markers: Vec<TokenId>,
    /// How embeddings are pooled; `None`: the server does not embed (`--embeddings` off).
    pub pooling: Option<Pooling>,
    /// Width of a token's embedding.
    pub n_embd: usize,
    /// The model can generate (an encoder only embeds).
    pub generates: bool,
    /// The file's `tokenizer.chat_template.rerank`: how a reranker reads a query and a
    /// document.
    pub rerank_template: Option<String>,
    /// The vision encoder (`--mmproj`), if the server takes images.
    pub vision: Option<Arc<ferrox_models::vision::VisionEncoder>>,
    /// Whether images may be given by `http(s)://` URLs (`--allow-remote-images`).
    pub allow_remote_images: bool,
    /// Images encoded lately, for requests that send them again.
    pub image_cache: crate::images::ImageCache,
}

impl Ready {
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Ok(()),
            Some(m) if self.accepted_ids.iter().any(|id| id == m) => Ok(()),
            Some(m) => Err(ApiError::not_found(format!(
                "The model `{m}` does not exist; this server serves `{}`",
                self.model_id
            ))
            .with_param("model")
            .with_code("model_not_found")),
        }
    }
}

/// The vision encoder of `--mmproj`, if given, checked against the model.
fn vision_encoder(
    config: &ServerConfig,
    engine: &AnyEngine,
) -> anyhow::Result<Option<Arc<ferrox_models::vision::VisionEncoder>>> {
    let Some(path) = &config.mmproj else {
        return Ok(None);
    };
    let encoder = open_vision(path, engine, config.image_tokens)?;
    tracing::info!(
        "vision projector {} ({}, {} tokens per image)",
        path.display(),
        encoder.config().projector.name(),
        encoder.tokens_per_image()
    );
    Ok(Some(Arc::new(encoder)))
}

/// The vision encoder of an `mmproj` file (`--mmproj`) for `engine`'s model, run with the
/// engine's threads, its attention in f32 when the engine's cache is (llama.cpp's flash
/// attention off), `image_tokens` the fewest and most tokens an image may become (dynamic-size
/// projectors). The model must take embeddings of the projector's output width.
pub fn open_vision(
    path: &std::path::Path,
    engine: &AnyEngine,
    (image_min_tokens, image_max_tokens): (Option<usize>, Option<usize>),
) -> anyhow::Result<ferrox_models::vision::VisionEncoder> {
    use ferrox_models::vision::{VisionEncoder, VisionOptions};
    let options = VisionOptions {
        threads: engine.threads(),
        f32_attention: engine.memory_spec().storage == ferrox_core::KvStorage::F32,
        image_min_tokens,
        image_max_tokens,
    };
    let mut encoder = VisionEncoder::open(path, &options)
        .with_context(|| format!("--mmproj {}", path.display()))?;
    encoder.fit_markers_to(engine.gguf());
    if !engine.accepts_embeddings() {
        bail!(
            "--mmproj: the {} engine does not take image embeddings",
            engine.architecture()
        );
    }
    if encoder.bidirectional() && !engine.accepts_bidirectional() {
        bail!(
            "--mmproj {}: the {} projector's image tokens attend to each other both ways, which the {} engine's attention does not do: not this model's projector",
            path.display(),
            encoder.config().projector.name(),
            engine.architecture()
        );
    }
    if encoder.grid_positions() && !engine.accepts_image_grids() {
        bail!(
            "--mmproj {}: the {} projector places image tokens by M-RoPE (Qwen-VL), which the {} model does not use: not this model's projector",
            path.display(),
            encoder.config().projector.name(),
            engine.architecture()
        );
    }
    if encoder.output_width() != engine.input_embedding_size() {
        bail!(
            "--mmproj {}: the projector writes rows of {} values but the model takes rows of {}: not this model's projector",
            path.display(),
            encoder.output_width(),
            engine.input_embedding_size()
        );
    }
    Ok(encoder)
}

/// The KV block pool: `--kv-memory` MiB, or room for `--parallel` full contexts.
fn kv_pool(config: &ServerConfig, engine: &AnyEngine) -> anyhow::Result<KvPool> {
    let n_ctx = engine.context_size();
    let parallel = config.parallel.max(1);
    let spec = engine.memory_spec();
    let block_bytes = spec.bytes_per_block(kv::BLOCK_TOKENS);
    // Recurrent states are reserved per sequence slot.
    let state_bytes = spec.recurrent_bytes() * parallel;
    let context_blocks = n_ctx.div_ceil(kv::BLOCK_TOKENS);
    let n_blocks = match config.kv_memory_mib {
        // Nothing is kept per position (an encoder): the blocks only count positions.
        _ if block_bytes == 0 && state_bytes == 0 => context_blocks * parallel,
        Some(mib) => {
            let fit = (mib << 20).saturating_sub(state_bytes) / block_bytes.max(1);
            if fit < context_blocks {
                bail!(
                    "--kv-memory {mib} MiB cannot hold one sequence of {n_ctx} positions ({} MiB); lower --ctx-size or raise --kv-memory",
                    (context_blocks * block_bytes + state_bytes).div_ceil(1 << 20)
                );
            }
            fit
        }
        None => context_blocks * parallel,
    };
    let pool = KvPool::new(engine, n_blocks, parallel).context("the KV pool")?;
    tracing::info!(
        "KV pool: {n_blocks} blocks of {} positions ({} MiB, {:.0} bytes per position), up to {parallel} sequences of {n_ctx} positions",
        kv::BLOCK_TOKENS,
        pool.reserved_bytes().div_ceil(1 << 20),
        pool.bytes_per_position()
    );
    Ok(pool)
}

/// The chat template to use and where it came from: `choice` is `chatml`, a template name
/// stored in the model or a Jinja file; none means the model's own (or, without one, the
/// built-in format its vocabulary's turn markers call for).
pub fn resolve_template(
    choice: Option<&str>,
    engine: &AnyEngine,
    tokenizer: &Tokenizer,
) -> anyhow::Result<(ChatTemplate, String)> {
    let meta = engine.gguf().metadata();
    match choice {
        None => match ChatTemplate::from_metadata(&meta).context("the model's chat template")? {
            Some(t) => Ok((t, "the model's tokenizer.chat_template".into())),
            None => {
                let vocab = tokenizer.vocab();
                let (t, name) = ChatTemplate::for_vocabulary(|m| vocab.id(m).is_some());
                tracing::warn!(
                    "the model has no chat template; using the built-in {name} format (its vocabulary's turn markers) for /v1/chat/completions"
                );
                Ok((t, format!("built-in {name} (the model has no template)")))
            }
        },
        Some("chatml") => Ok((
            ChatTemplate::chatml(),
            "ChatML (--chat-template chatml)".into(),
        )),
        Some(name) => {
            let path = std::path::Path::new(name);
            if path.is_file() {
                let source = std::fs::read_to_string(path)
                    .with_context(|| format!("reading --chat-template {name}"))?;
                let t = ChatTemplate::new(&source)
                    .with_context(|| format!("--chat-template {name}"))?;
                return Ok((t, format!("the file {name}")));
            }
            match ChatTemplate::from_metadata_named(&meta, name)
                .context("the model's chat templates")?
            {
                Some(t) => Ok((t, format!("the model's tokenizer.chat_template.{name}"))),
                None => {
                    let names = ChatTemplate::metadata_names(&meta);
                    bail!(
                        "--chat-template {name}: no such file, and the model has no template of that name (it has: {})",
                        if names.is_empty() { "none".to_string() } else { names.join(", ") }
                    )
                }
            }
        }
    }
}

/// Builds what serving needs from a loaded model: template, KV pool, the scheduler.
pub(crate) fn prepare(
    config: &ServerConfig,
    model: LoadedModel,
    metrics: Arc<Metrics>,
) -> anyhow::Result<Ready> {
    let LoadedModel {
        path,
        engine,
        tokenizer,
        draft,
    } = model;
    let (template, template_source) =
        resolve_template(config.chat_template.as_deref(), &engine, &tokenizer)?;
    let n_ctx = engine.context_size();
    let n_vocab = engine.vocab_size().min(tokenizer.vocab().len());
    check_speculation(config, &engine)?;
    let pooling = embedding_pooling(config, &engine)?;
    let n_embd = engine.embedding_size();
    let generates = !engine.is_encoder();
    let rerank_template = engine
        .gguf()
        .metadata()
        .opt_str("tokenizer.chat_template.rerank")
        .ok()
        .flatten()
        .map(str::to_string);
    let vision = vision_encoder(config, &engine)?;
    let pool = kv_pool(config, &engine)?;
    let vocab = tokenizer.vocab();
    let token_text = |id: Option<u32>| id.map(|id| vocab.text(id).to_string()).unwrap_or_default();
    let render_options = RenderOptions {
        bos_token: token_text(vocab.bos()),
        eos_token: token_text(vocab.eos()),
        ..Default::default()
    };
    let template_stops = template_stops(&template, &tokenizer);
    let (model_id, accepted_ids) = model_ids(config, &path);
    tracing::info!(
        "loaded {} ({}, {} vocab, {} threads)",
        path.display(),
        engine.architecture(),
        n_vocab,
        engine.threads()
    );
    tracing::info!("chat template: {template_source}");
    let slots = pool.max_sequences();
    let kv_blocks = pool.n_blocks();
    // vLLM's names for the float caches; llama.cpp's for the others (`q8_0`, `f16/q4_0`).
    let cache_dtype = match engine.memory_spec().storage {
        ferrox_core::KvStorage::F16 => "float16".to_string(),
        ferrox_core::KvStorage::F32 => "float32".to_string(),
        other => other.name(),
    };
    metrics.set_served(ServedModel {
        name: model_id.clone(),
        cache_dtype: cache_dtype.clone(),
    });

    let tokenizer = Arc::new(tokenizer);
    let compiler = GrammarEngine::build(&tokenizer, engine.vocab_size(), generates);
    let (tool_format, tool_markers) = tool_format(&template, &tokenizer);
    if ferrox_agent::reasoning::template_thinks(template.source()) {
        tracing::info!(
            "the template has thinking blocks; reasoning goes to {}",
            match config.reasoning_format {
                ReasoningFormat::DeepSeek => "reasoning_content",
                ReasoningFormat::None => "content",
            }
        );
    }
    let draft = draft_model(config, draft, n_vocab)?;
    let scheduler = Scheduler::start(
        engine,
        pool,
        tokenizer.clone(),
        SchedulerOptions {
            max_queue: config.max_queue,
            prefill_chunk: config.prefill_chunk.max(1),
            prefill_chunk_idle: config.prefill_chunk.max(512),
            speculation: config.speculation,
        },
        metrics,
        draft,
    );
    Ok(Ready {
        model_id,
        model_path: path.display().to_string(),
        accepted_ids,
        created: unix_time(),
        tokenizer,
        template,
        render_options,
        template_stops,
        n_ctx,
        n_vocab,
        slots,
        kv_blocks,
        cache_dtype,
        scheduler,
        compiler,
        tool_format,
        tool_markers,
        pooling,
        n_embd,
        generates,
        rerank_template,
        vision,
        allow_remote_images: config.allow_remote_images,
        image_cache: Default::default(),
    })
}

/// The pooling of `--embeddings` (`--pooling`, else the file's), refused where it cannot be
/// computed; `None` without `--embeddings`.
fn embedding_pooling(config: &ServerConfig, engine: &AnyEngine) -> anyhow::Result<Option<Pooling>> {
    if !config.embeddings {
        if engine.is_encoder() {
            bail!(
                "{} is an embedding model (an encoder): serve it with --embeddings",
                engine.architecture()
            );
        }
        return Ok(None);
    }
    let pooling = match config.pooling {
        Some(p) => p,
        None => Pooling::of_model(engine).context("--embeddings")?,
    };
    let pooling = pooling.check(engine).context("--embeddings")?;
    tracing::info!(
        "embeddings: {} pooling, {} values each",
        pooling.name(),
        engine.embedding_size()
    );
    Ok(Some(pooling))
}

/// Refuses speculation the engine cannot do: an MTP draft without the block, or drafts
/// longer than its memory can forget.
fn check_speculation(config: &ServerConfig, engine: &AnyEngine) -> anyhow::Result<()> {
    let Some(spec) = &config.speculation else {
        return Ok(());
    };
    if spec.mtp && !engine.has_mtp() {
        bail!(
            "--spec-type draft-mtp: {} has no multi-token-prediction block to draft with",
            engine.architecture()
        );
    }
    match engine.memory_spec().rollback_reach() {
        0 => bail!(
            "speculative decoding: {} keeps a recurrent state that cannot forget rejected draft tokens; serve it without speculation",
            engine.architecture()
        ),
        reach if reach < spec.max => bail!(
            "speculative decoding: {} can forget at most {reach} rejected draft tokens; use --draft-max {reach} or less",
            engine.architecture()
        ),
        _ => Ok(()),
    }
}

/// End-of-turn markers the template prints that the vocabulary does not know as
/// end-of-generation tokens: chat requests stop at their text.
fn template_stops(template: &ChatTemplate, tokenizer: &Tokenizer) -> Vec<String> {
    let vocab = tokenizer.vocab();
    let stops: Vec<String> = ["<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>"]
        .into_iter()
        .filter(|marker| template.source().contains(marker))
        .filter(|marker| !matches!(tokenizer.encode(marker, false, true).as_slice(), [id] if vocab.is_eog(*id)))
        .map(str::to_string)
        .collect();
    if !stops.is_empty() {
        tracing::info!("chat stop strings from the template: {stops:?}");
    }
    stops
}

/// The served model's id (`--alias`, else the file name) and every name a request's
/// `model` may use (the id, the file name, the path, the file stem).
fn model_ids(config: &ServerConfig, path: &Path) -> (String, Vec<String>) {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let model_id = config.alias.clone().unwrap_or_else(|| file_name.clone());
    let mut accepted_ids = vec![model_id.clone(), file_name, path.display().to_string()];
    if let Some(stem) = path.file_stem() {
        accepted_ids.push(stem.to_string_lossy().into_owned());
    }
    (model_id, accepted_ids)
}

/// The grammar engine over the vocabulary, built before the server serves. It takes a
/// second or more on a large vocabulary (llguidance's token trie and slices); built beside
/// serving, it took a core from the first requests' decode (a third slower on two cores)
/// and made the first constrained request wait for it.
pub(crate) struct GrammarEngine {
    built: Built,
}

/// The engine once built: `None` when it could not be.
type Built = Option<Arc<ConstraintCompiler>>;

impl GrammarEngine {
    /// The engine for a model that `generates` (an encoder, which only embeds, needs none).
    fn build(tokenizer: &Arc<Tokenizer>, n_vocab: usize, generates: bool) -> GrammarEngine {
        GrammarEngine {
            built: generates
                .then(|| constraint_compiler(tokenizer, n_vocab))
                .flatten(),
        }
    }

    /// The engine; `None` when it could not be built.
    pub fn get(&self) -> Option<Arc<ConstraintCompiler>> {
        self.built.clone()
    }
}

/// The grammar engine over the vocabulary; `None` (constrained requests refused) when it
/// cannot be built.
fn constraint_compiler(
    tokenizer: &Arc<Tokenizer>,
    n_vocab: usize,
) -> Option<Arc<ConstraintCompiler>> {
    let started = Instant::now();
    match ConstraintCompiler::new(tokenizer.clone(), n_vocab) {
        Ok(c) => {
            tracing::info!(
                "grammar engine ready in {:.0} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            Some(Arc::new(c))
        }
        Err(e) => {
            tracing::warn!("constrained decoding is unavailable: {e:#}");
            None
        }
    }
}

/// How the model writes tool calls (from its template; Hermes when it shows none), and the
/// format's markers that are control tokens.
fn tool_format(template: &ChatTemplate, tokenizer: &Tokenizer) -> (ToolFormat, Vec<TokenId>) {
    let detected = ToolFormat::detect(template.source());
    let format = detected.unwrap_or(ToolFormat::Hermes);
    tracing::info!(
        "tool-call format: {}{}",
        format.name(),
        if detected.is_none() {
            " (the template shows none; the default)"
        } else {
            ""
        }
    );
    let markers = format
        .markers()
        .iter()
        .filter_map(|m| match tokenizer.encode(m, false, true).as_slice() {
            [id] if tokenizer.piece(*id, false).is_empty() => Some(*id),
            _ => None,
        })
        .collect();
    (format, markers)
}

/// The draft model's sequences, when one is given (speculation must be on).
fn draft_model(
    config: &ServerConfig,
    draft: Option<AnyEngine>,
    n_vocab: usize,
) -> anyhow::Result<Option<DraftModel>> {
    match (draft, &config.speculation) {
        (Some(draft), Some(spec)) => {
            tracing::info!(
                "draft model: {} (drafts of up to {} tokens)",
                draft.architecture(),
                spec.max
            );
            let model = DraftModel::new(draft, config.parallel.max(1), spec.p_min, n_vocab)
                .context("the draft model's memory")?;
            Ok(Some(model))
        }
        (Some(_), None) => bail!("a draft model is given but speculation is off"),
        (None, _) => Ok(None),
    }
}
