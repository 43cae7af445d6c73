//! DeepSeek-V4: compressed sparse attention over a sliding window, manifold-constrained
//! hyper-connections, hash-routed and sqrt-softplus-gated experts. Run by
//! [`crate::deepseek4`].

use crate::deepseek4::{Deepseek4Config, Deepseek4Engine};

/// `deepseek4`, run by the DeepSeek-V4 engine.
pub const ARCH: super::Architecture = super::Architecture {
    name: "deepseek4",
    load: |gguf, options| {
        let config = Deepseek4Config::read(&gguf)?;
        Ok(Box::new(Deepseek4Engine::with_config(
            gguf, options, config,
        )?))
    },
};
