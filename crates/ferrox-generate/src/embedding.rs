//! Text embeddings from any engine: the engine gives back each token's hidden state after
//! the final norm ([`Output::Embeddings`](ferrox_engine::Output)); a [`Pooler`] turns a
//! sequence's rows into its embedding as llama.cpp's pooling types do, and [`normalize`]
//! scales it as llama.cpp's `embd_normalize` does.

use ferrox_engine::{Engine, EngineError, EngineExt, LogitsFor, Output, State, TokenId};

/// How a sequence's token embeddings become one embedding (llama.cpp's `--pooling`, and the
/// file's `<arch>.pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// No pooling: every token's embedding.
    None,
    /// The mean of the tokens' embeddings.
    Mean,
    /// The first token's embedding.
    Cls,
    /// The last token's embedding (decoder embedding models such as Qwen3-Embedding).
    Last,
    /// A classification head's scores over the first token (rerankers).
    Rank,
}

/// A pooling type llama.cpp does not know, or one the model cannot do.
#[derive(Debug, thiserror::Error)]
pub enum PoolingError {
    #[error("unknown pooling type `{0}` (none, mean, cls, last or rank)")]
    UnknownName(String),
    #[error("`{key}` = {value} is not a pooling type llama.cpp knows (0-4)")]
    UnknownId { key: String, value: i64 },
    #[error(
        "rank pooling scores with a reranker's classification head (cls.output), which {0} \
         does not have: give --pooling none, mean, cls or last"
    )]
    NoClassifier(String),
}

impl Pooling {
    pub const NAMES: [&'static str; 5] = ["none", "mean", "cls", "last", "rank"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn from_name(name: &str) -> Result<Pooling, PoolingError> {
        match name {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Ok(Pooling::Rank),
            _ => Err(PoolingError::UnknownName(name.to_string())),
        }
    }

    /// The file's `<arch>.pooling_type` (llama.cpp's ids), or [`Pooling::None`] where the
    /// file names none, as llama.cpp defaults.
    pub fn of_model<E: Engine + ?Sized>(engine: &E) -> Result<Pooling, PoolingError> {
        let key = format!("{}.pooling_type", engine.architecture());
        let value = engine.gguf().metadata().opt_int::<i64>(&key).ok().flatten();
        match value {
            None | Some(-1) | Some(0) => Ok(Pooling::None),
            Some(1) => Ok(Pooling::Mean),
            Some(2) => Ok(Pooling::Cls),
            Some(3) => Ok(Pooling::Last),
            Some(4) => Ok(Pooling::Rank),
            Some(value) => Err(PoolingError::UnknownId { key, value }),
        }
    }

    /// Refuses what the model cannot do: rank pooling without a classification head.
    pub fn check<E: Engine + ?Sized>(self, engine: &E) -> Result<Pooling, PoolingError> {
        match self {
            Pooling::Rank if !engine.has_classifier() => Err(PoolingError::NoClassifier(
                engine.architecture().to_string(),
            )),
            p => Ok(p),
        }
    }
}

/// Which rows a [`Pooler`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Keep {
    All,
    Sum,
    First,
    Last,
}

/// Pools a sequence's token embeddings as its rows arrive, a chunk at a time and in order.
#[derive(Clone, Debug)]
pub struct Pooler {
    pooling: Pooling,
    keep: Keep,
    n_embd: usize,
    rows: usize,
    /// Every row ([`Keep::All`]), or the running result.
    values: Vec<f32>,
}

impl Pooler {
    /// A pooler of `engine`'s rows. Rank pooling reads the first token's row of an encoder
    /// and the last token's of a decoder, as llama.cpp does.
    pub fn new<E: Engine + ?Sized>(pooling: Pooling, engine: &E) -> Pooler {
        let keep = match pooling {
            Pooling::None => Keep::All,
            Pooling::Mean => Keep::Sum,
            Pooling::Cls => Keep::First,
            Pooling::Last => Keep::Last,
            Pooling::Rank if engine.is_encoder() => Keep::First,
            Pooling::Rank => Keep::Last,
        };
        Self::keeping(pooling, keep, engine.embedding_size())
    }

    fn keeping(pooling: Pooling, keep: Keep, n_embd: usize) -> Pooler {
        let values = match keep {
            Keep::All => Vec::new(),
            _ => vec![0.0; n_embd],
        };
        Pooler {
            pooling,
            keep,
            n_embd,
            rows: 0,
            values,
        }
    }

    /// The next rows of the sequence (`n_embd` each), following those pushed before.
    pub fn push(&mut self, rows: &[f32]) {
        let n_embd = self.n_embd;
        match self.keep {
            Keep::All => self.values.extend_from_slice(rows),
            // The sum, divided at the end.
            Keep::Sum => {
                for row in rows.chunks_exact(n_embd) {
                    self.values.iter_mut().zip(row).for_each(|(a, x)| *a += x);
                }
            }
            Keep::First => {
                if self.rows == 0 && rows.len() >= n_embd {
                    self.values.copy_from_slice(&rows[..n_embd]);
                }
            }
            Keep::Last => {
                if rows.len() >= n_embd {
                    self.values.copy_from_slice(&rows[rows.len() - n_embd..]);
                }
            }
        }
        self.rows += rows.len() / n_embd;
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The pooled embedding (one), every token's ([`Pooling::None`]), or the
    /// classification head's scores of the pooled row ([`Pooling::Rank`]).
    pub fn finish<E: Engine + ?Sized>(self, engine: &E) -> Result<Vec<Vec<f32>>, EngineError> {
        let rank = self.pooling == Pooling::Rank;
        let pooled = self.pooled();
        match rank {
            true => Ok(vec![engine.classify(&pooled[0])?]),
            false => Ok(pooled),
        }
    }

    /// The rows kept: their mean, the one row, or all of them.
    fn pooled(mut self) -> Vec<Vec<f32>> {
        match self.keep {
            Keep::All => self
                .values
                .chunks_exact(self.n_embd)
                .map(<[f32]>::to_vec)
                .collect(),
            Keep::Sum if self.rows > 0 => {
                let inv = 1.0 / self.rows as f32;
                self.values.iter_mut().for_each(|v| *v *= inv);
                vec![self.values]
            }
            _ => vec![self.values],
        }
    }
}

/// Scales an embedding as llama.cpp's `common_embd_normalize`: `-1` leaves it, `0` to the
/// int16 range by its largest magnitude, `2` to unit Euclidean length, any other `p` to unit
/// p-norm. A zero vector stays zero.
pub fn normalize(v: &mut [f32], p: i32) {
    let norm: f64 = match p {
        -1 => 1.0,
        0 => v.iter().fold(0.0f64, |m, &x| m.max(x.abs() as f64)) / 32760.0,
        2 => v.iter().map(|&x| (x * x) as f64).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|&x| (x.abs() as f64).powi(p))
            .sum::<f64>()
            .powf(1.0 / p as f64),
    };
    let scale = if norm > 0.0 { (1.0 / norm) as f32 } else { 0.0 };
    v.iter_mut().for_each(|x| *x *= scale);
}

/// Embeds one token sequence on its own (`ferrox embedding`): `state` is emptied first and
/// the tokens run in chunks of `batch` (an encoder's all at once).
pub fn embed_tokens<E: Engine + ?Sized>(
    engine: &E,
    state: &mut State,
    tokens: &[TokenId],
    pooling: Pooling,
    batch: usize,
) -> Result<Vec<Vec<f32>>, EngineError> {
    state.reset();
    let batch = match engine.is_encoder() {
        true => tokens.len(),
        false => batch,
    };
    let mut pooler = Pooler::new(pooling, engine);
    for (i, chunk) in tokens.chunks(batch.max(1)).enumerate() {
        let start = i * batch.max(1);
        let rows = engine.forward_rows(chunk, start, state, LogitsFor::All, Output::Embeddings)?;
        pooler.push(rows);
    }
    pooler.finish(engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<f32> {
        // Three rows of width 2.
        vec![1.0, 2.0, 3.0, -4.0, 5.0, 6.0]
    }

    #[test]
    fn pools_as_llama_cpp_names_them() {
        let pooled = |keep: Keep, chunks: &[usize]| {
            let mut pooler = Pooler::keeping(Pooling::Mean, keep, 2);
            let data = rows();
            let mut at = 0;
            for &n in chunks {
                pooler.push(&data[at..at + 2 * n]);
                at += 2 * n;
            }
            assert_eq!(pooler.rows(), 3);
            pooler.pooled()
        };
        for chunks in [&[3][..], &[1, 2], &[1, 1, 1]] {
            assert_eq!(pooled(Keep::Sum, chunks), vec![vec![3.0, 4.0 / 3.0]]);
            assert_eq!(pooled(Keep::First, chunks), vec![vec![1.0, 2.0]]);
            assert_eq!(pooled(Keep::Last, chunks), vec![vec![5.0, 6.0]]);
            assert_eq!(
                pooled(Keep::All, chunks),
                vec![vec![1.0, 2.0], vec![3.0, -4.0], vec![5.0, 6.0]]
            );
        }
    }

    #[test]
    fn normalizes_as_common_embd_normalize() {
        let norm = |p: i32| {
            let mut v = vec![3.0f32, -4.0];
            normalize(&mut v, p);
            v
        };
        assert_eq!(norm(-1), vec![3.0, -4.0]);
        assert_eq!(norm(2), vec![0.6, -0.8]);
        // Multiplied by the f32 reciprocal, as llama.cpp does.
        let inv7 = 1.0f32 / 7.0;
        assert_eq!(norm(1), vec![3.0 * inv7, -4.0 * inv7]);
        let int16 = norm(0);
        assert!((int16[1] + 32760.0).abs() < 1e-2, "{int16:?}");
        let mut zero = vec![0.0f32; 3];
        normalize(&mut zero, 2);
        assert_eq!(zero, vec![0.0; 3]);
    }

    #[test]
    fn names_round_trip() {
        for name in Pooling::NAMES {
            assert_eq!(Pooling::from_name(name).unwrap().name(), name);
        }
        assert!(Pooling::from_name("max").is_err());
    }
}
