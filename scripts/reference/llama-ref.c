/*
 * llama-ref: a small reference program against llama.cpp's C API (include/llama.h), used to
 * produce the llama.cpp reference fixtures that Ferrox is tested against.
 * Our own code; it only calls llama.cpp's public API. Build with scripts/reference/build.sh.
 *
 * Modes (all numbers are decimal):
 *
 *   llama-ref logits MODEL CTX N_THREADS TOKENS_FILE OUT
 *       Evaluates the token ids in TOKENS_FILE (decimal ids separated by anything that is not a
 *       digit: whitespace, commas, a JSON array...) as ONE batch (n_batch = n_ubatch = n_tokens),
 *       positions 0..n-1, sequence 0, requesting logits for every position, and writes them to
 *       OUT as raw little-endian f32, row-major [n_tokens][n_vocab]. The ids are used as given:
 *       no BOS is added. Prints a JSON object describing the settings on stdout.
 *       CTX = 0 means n_ctx = n_tokens.
 *
 *   llama-ref greedy MODEL CTX N_THREADS N_PREDICT PROMPT_FILE OUT_JSON
 *       Tokenizes the bytes of PROMPT_FILE exactly like llama-completion does for a raw prompt
 *       (llama_tokenize with add_special = true, so BOS is prepended when the GGUF says
 *       add_bos_token, and parse_special = true, so "<start_of_turn>" etc. become control
 *       tokens), decodes the prompt as one batch (logits for the last position only), then
 *       decodes N_PREDICT tokens greedily, one token per llama_decode call. Greedy = argmax of
 *       the raw logits, the lowest id wins a tie. End-of-generation tokens do NOT stop the
 *       loop (no logit bias is applied either); the index of the first one is recorded.
 *       Writes {"settings", "tokenize", "prompt_ids", "generated", "first_eog_index",
 *       "top2_gap", "top5", "pieces", "generated_text"} to OUT_JSON. top2_gap[i] = largest minus
 *       second-largest logit at step i; top5[i] = the five best [id, logit] pairs at step i.
 *       "pieces" (llama_token_to_piece per token) and "generated_text" (llama_detokenize of all
 *       generated ids, special tokens rendered) are for humans: a piece holding part of a UTF-8
 *       character shows its stray bytes as \u00XX.
 *
 *   llama-ref sweep MODEL CTX N_THREADS TOKENS_FILE N_GREEDY OUT_JSON
 *       Every context length of one token sequence, three ways: (1) "all": the whole
 *       sequence as one batch with logits for every position; (2) "prompt": for each length
 *       p = 1..n, the first p tokens as a fresh prompt (memory cleared, one batch, logits for
 *       the last position); (3) "greedy": after each such prompt, N_GREEDY tokens decoded
 *       greedily one at a time. Records the five most likely ids with their log-probabilities
 *       (logit minus the log-sum-exp of the row, in double precision) at every step:
 *       {"settings", "tokens", "all": [[[id, logprob] x5] x n], "prompt": [... x n],
 *       "greedy": [{"ids": [...], "top5": [[[id, logprob] x5] x N_GREEDY]} x n]}.
 *
 *   llama-ref tokenize MODEL PROMPT_FILE
 *       Prints the prompt ids (same tokenization as greedy) as a JSON array.
 *
 *   llama-ref info MODEL CTX N_THREADS
 *       Prints the settings JSON (what the other modes record) without evaluating anything.
 *
 *   llama-ref embed MODEL CTX N_THREADS POOLING TOKENS_FILE OUT_JSON
 *       Embeddings (llama_context_params.embeddings = true, pooling_type = POOLING: none,
 *       mean, cls, last or rank). Each line of TOKENS_FILE is one sequence of token ids, run
 *       alone (memory cleared) as one batch with every token an output, as llama-embedding
 *       does. Writes {"settings", "pooling", "n_embd", "embeddings": [per line: [vector, ...]]}:
 *       the pooled vector (llama_get_embeddings_seq), or every token's (none), NOT normalized;
 *       with rank, the classification head's first score.
 *
 * Context parameters: llama_context_default_params() except n_ctx, n_threads,
 * n_threads_batch (both = N_THREADS) and, for logits mode, n_batch = n_ubatch = n_tokens.
 * Flash attention is left at the default (AUTO); the program records what AUTO resolved to by
 * watching llama.cpp's log ("Flash Attention enabled" / "... not supported, set to disabled").
 * Set LLAMA_REF_VERBOSE=1 to see llama.cpp's log on stderr. LLAMA_REF_FLASH_ATTN=0|1 forces
 * flash attention off/on, LLAMA_REF_NO_REPACK=1 keeps the weights in the file's layout and
 * LLAMA_REF_KV_TYPE=f32|f16|... sets the KV cache type (the fixtures use the defaults: flash
 * attention AUTO, repacking on, f16 K and V; the greedy fixture also records the flash
 * attention off and repacking off runs as measurements of llama.cpp's own rounding noise).
 */
#define _POSIX_C_SOURCE 200809L
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPK 5

static int g_verbose = 0;
static int g_fa_state = -1; /* -1 unknown, 0 disabled, 1 enabled */
static int g_embed_pooling = -2; /* embed mode: the llama_pooling_type asked for */

static void log_cb(enum ggml_log_level level, const char * text, void * user) {
    (void) level;
    (void) user;
    if (strstr(text, "Flash Attention enabled")) {
        g_fa_state = 1;
    } else if (strstr(text, "Flash Attention not supported")) {
        g_fa_state = 0;
    }
    if (g_verbose) {
        fputs(text, stderr);
    }
}

static void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llama-ref: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static char * read_file(const char * path, size_t * len_out) {
    FILE * f = fopen(path, "rb");
    if (!f) {
        die("cannot open %s", path);
    }
    size_t cap = 4096, len = 0;
    char * buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        if (n == 0) {
            break;
        }
        len += n;
    }
    fclose(f);
    buf[len] = 0;
    *len_out = len;
    return buf;
}

static llama_token * parse_ids(const char * text, int * n_out) {
    int cap = 64, n = 0;
    llama_token * ids = malloc(sizeof(llama_token) * cap);
    const char * p = text;
    while (*p) {
        if (*p >= '0' && *p <= '9') {
            long v = strtol(p, (char **) &p, 10);
            if (n == cap) {
                cap *= 2;
                ids = realloc(ids, sizeof(llama_token) * cap);
            }
            ids[n++] = (llama_token) v;
        } else {
            p++;
        }
    }
    *n_out = n;
    return ids;
}

/* JSON string escaping of arbitrary bytes (invalid UTF-8 bytes are kept as-is except control
 * characters; pieces of multi-byte characters may be split across tokens, so the "pieces" are
 * informational only). */
static void json_str(FILE * f, const char * s, int n) {
    fputc('"', f);
    for (int i = 0; i < n; i++) {
        unsigned char c = (unsigned char) s[i];
        switch (c) {
            case '"': fputs("\\\"", f); break;
            case '\\': fputs("\\\\", f); break;
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    fprintf(f, "\\u%04x", c);
                } else if (c >= 0x80) {
                    /* keep valid UTF-8 sequences, escape stray bytes as \u00XX of the byte */
                    int len = (c >= 0xf0 && c < 0xf8) ? 4 : (c >= 0xe0) ? 3 : (c >= 0xc0) ? 2 : 0;
                    int ok = len > 0 && i + len <= n;
                    for (int k = 1; ok && k < len; k++) {
                        ok = (((unsigned char) s[i + k]) & 0xc0) == 0x80;
                    }
                    if (ok) {
                        fwrite(s + i, 1, len, f);
                        i += len - 1;
                    } else {
                        fprintf(f, "\\u%04x", c); /* marks a partial byte: not a real code point */
                    }
                } else {
                    fputc(c, f);
                }
        }
    }
    fputc('"', f);
}

static const char * fa_type_str(enum llama_flash_attn_type t) {
    return llama_flash_attn_type_name(t);
}

typedef struct {
    struct llama_model * model;
    struct llama_context * ctx;
    const struct llama_vocab * vocab;
    struct llama_context_params cparams;
    int n_vocab;
} ref_t;

static struct llama_model * load_model(const char * path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    /* LLAMA_REF_NO_REPACK=1: weights stay in the file's layout (llama.cpp's --no-repack) */
    const char * no_repack = getenv("LLAMA_REF_NO_REPACK");
    if (no_repack && strcmp(no_repack, "1") == 0) {
        mp.use_extra_bufts = false;
    }
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        die("unable to load model %s", path);
    }
    return model;
}

/* LLAMA_REF_DUMP=DIR (investigation knob): every f32 tensor of the graph whose name starts with
   one of LLAMA_REF_DUMP_NAMES (comma separated, default "Kcur,Qcur,Vcur,kqv_out,attn_norm")
   is written to DIR/<name>.<n_tokens>.f32 (raw f32) as it is computed. */
static bool dump_tensor(struct ggml_tensor * t, bool ask, void * user_data) {
    const char * dir = (const char *) user_data;
    const char * names = getenv("LLAMA_REF_DUMP_NAMES");
    if (!names || !*names) {
        names = "Kcur,Qcur,Vcur,kqv_out,attn_norm";
    }
    bool wanted = false;
    const char * p = names;
    while (*p) {
        const char * end = strchr(p, ',');
        size_t len = end ? (size_t) (end - p) : strlen(p);
        if (len > 0 && strncmp(t->name, p, len) == 0) {
            wanted = true;
        }
        p += len + (end ? 1 : 0);
    }
    if (ask) {
        return wanted;
    }
    if (wanted && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t)) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.%lld.f32", dir, t->name, (long long) t->ne[ggml_n_dims(t) - 1]);
        size_t n = ggml_nbytes(t);
        float * buf = malloc(n);
        ggml_backend_tensor_get(t, buf, 0, n);
        FILE * f = fopen(path, "wb");
        if (f) {
            fwrite(buf, 1, n, f);
            fclose(f);
        }
        free(buf);
    }
    return true;
}

/* the ggml type called `name` (a cache type) */
static enum ggml_type type_named(const char * name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((enum ggml_type) t);
        if (n && strcmp(n, name) == 0) {
            return (enum ggml_type) t;
        }
    }
    die("unknown cache type %s", name);
    return GGML_TYPE_F16;
}

static void make_ctx(ref_t * r, uint32_t n_ctx, int n_threads, int n_batch) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    /* investigation knob, not used for the fixtures: LLAMA_REF_FLASH_ATTN=0|1|auto */
    const char * fa = getenv("LLAMA_REF_FLASH_ATTN");
    if (fa && *fa) {
        cp.flash_attn_type = strcmp(fa, "1") == 0   ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                           : strcmp(fa, "0") == 0   ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                                    : LLAMA_FLASH_ATTN_TYPE_AUTO;
    }
    /* investigation knob too: LLAMA_REF_KV_TYPE=f32|f16|bf16|q8_0... sets type_k and type_v,
       LLAMA_REF_KV_TYPE_V then type_v alone */
    const char * kv = getenv("LLAMA_REF_KV_TYPE");
    if (kv && *kv) {
        cp.type_k = cp.type_v = type_named(kv);
    }
    const char * kv_v = getenv("LLAMA_REF_KV_TYPE_V");
    if (kv_v && *kv_v) {
        cp.type_v = type_named(kv_v);
    }
    const char * dump = getenv("LLAMA_REF_DUMP");
    if (dump && *dump) {
        cp.cb_eval = dump_tensor;
        cp.cb_eval_user_data = (void *) dump;
    }
    if (n_batch > 0) {
        cp.n_batch = (uint32_t) n_batch;
        cp.n_ubatch = (uint32_t) n_batch;
    }
    if (g_embed_pooling != -2) {
        cp.embeddings = true;
        cp.pooling_type = (enum llama_pooling_type) g_embed_pooling;
    }
    r->cparams = cp;
    r->ctx = llama_init_from_model(r->model, cp);
    if (!r->ctx) {
        die("failed to create the llama_context");
    }
}

static void write_settings(FILE * f, const ref_t * r, const char * mode) {
    char desc[256];
    llama_model_desc(r->model, desc, sizeof(desc));
    fprintf(f, "{\"mode\": \"%s\", \"llama_version\": ", mode);
    const char * ver = llama_version();
    json_str(f, ver, (int) strlen(ver));
    fprintf(f, ", \"ggml_version\": ");
    json_str(f, ggml_version(), (int) strlen(ggml_version()));
    fprintf(f, ", \"ggml_commit\": ");
    json_str(f, ggml_commit(), (int) strlen(ggml_commit()));
    fprintf(f, ", \"model_desc\": ");
    json_str(f, desc, (int) strlen(desc));
    fprintf(f, ", \"n_vocab\": %d", r->n_vocab);
    fprintf(f, ", \"n_ctx\": %u, \"n_batch\": %u, \"n_ubatch\": %u",
            llama_n_ctx(r->ctx), llama_n_batch(r->ctx), llama_n_ubatch(r->ctx));
    fprintf(f, ", \"n_threads\": %d, \"n_threads_batch\": %d", r->cparams.n_threads, r->cparams.n_threads_batch);
    fprintf(f, ", \"flash_attn_type\": \"%s\"", fa_type_str(r->cparams.flash_attn_type));
    int fa_state = r->cparams.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_ENABLED    ? 1
                 : r->cparams.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED ? 0
                                                                                : g_fa_state;
    fprintf(f, ", \"flash_attn_resolved\": %s",
            fa_state == 1 ? "\"enabled\"" : fa_state == 0 ? "\"disabled\"" : "\"unknown\"");
    fprintf(f, ", \"type_k\": \"%s\", \"type_v\": \"%s\"", ggml_type_name(r->cparams.type_k), ggml_type_name(r->cparams.type_v));
    fprintf(f, ", \"swa_full\": %s, \"kv_unified\": %s, \"offload_kqv\": %s",
            r->cparams.swa_full ? "true" : "false", r->cparams.kv_unified ? "true" : "false",
            r->cparams.offload_kqv ? "true" : "false");
    fprintf(f, ", \"n_gpu_layers\": 0");
    fprintf(f, ", \"add_bos\": %s", llama_vocab_get_add_bos(r->vocab) ? "true" : "false");
    fprintf(f, ", \"bos_id\": %d", llama_vocab_bos(r->vocab));
    fprintf(f, ", \"system_info\": ");
    const char * si = llama_print_system_info();
    int sl = (int) strlen(si);
    while (sl > 0 && (si[sl - 1] == ' ' || si[sl - 1] == '\n')) {
        sl--;
    }
    json_str(f, si, sl);
    fprintf(f, "}");
}

static llama_token * tokenize(const struct llama_vocab * vocab, const char * text, size_t len, int * n_out) {
    int n = -llama_tokenize(vocab, text, (int32_t) len, NULL, 0, true, true);
    if (n <= 0) {
        /* empty prompt: llama_tokenize returns 0 or the BOS-only count */
        n = 1;
    }
    llama_token * ids = malloc(sizeof(llama_token) * (n + 1));
    int got = llama_tokenize(vocab, text, (int32_t) len, ids, n + 1, true, true);
    if (got < 0) {
        die("failed to tokenize the prompt");
    }
    *n_out = got;
    return ids;
}

static int mode_logits(int argc, char ** argv) {
    if (argc != 7) {
        die("usage: %s logits MODEL CTX N_THREADS TOKENS_FILE OUT", argv[0]);
    }
    const char * model_path = argv[2];
    int n_ctx = atoi(argv[3]);
    int n_threads = atoi(argv[4]);
    size_t len;
    char * text = read_file(argv[5], &len);
    int n_tokens;
    llama_token * ids = parse_ids(text, &n_tokens);
    if (n_tokens == 0) {
        die("no token ids in %s", argv[5]);
    }
    if (n_ctx == 0) {
        n_ctx = n_tokens;
    }
    if (n_ctx < n_tokens) {
        die("CTX %d < number of tokens %d", n_ctx, n_tokens);
    }

    ref_t r = {0};
    r.model = load_model(model_path);
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    for (int i = 0; i < n_tokens; i++) {
        if (ids[i] < 0 || ids[i] >= r.n_vocab) {
            die("token id %d out of range (n_vocab %d)", ids[i], r.n_vocab);
        }
    }
    make_ctx(&r, (uint32_t) n_ctx, n_threads, n_tokens);

    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    for (int i = 0; i < n_tokens; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_tokens;
    if (llama_model_has_encoder(r.model)) {
        die("encoder-decoder models are not supported by logits mode");
    }
    int rc = llama_decode(r.ctx, batch);
    if (rc != 0) {
        die("llama_decode failed: %d", rc);
    }

    FILE * out = fopen(argv[6], "wb");
    if (!out) {
        die("cannot create %s", argv[6]);
    }
    for (int i = 0; i < n_tokens; i++) {
        const float * row = llama_get_logits_ith(r.ctx, i);
        if (!row) {
            die("no logits for position %d", i);
        }
        /* x86/ARM little-endian hosts: the in-memory f32 layout is the file layout */
        if (fwrite(row, sizeof(float), (size_t) r.n_vocab, out) != (size_t) r.n_vocab) {
            die("write failed");
        }
    }
    fclose(out);

    write_settings(stdout, &r, "logits");
    printf("\n");

    llama_batch_free(batch);
    llama_free(r.ctx);
    llama_model_free(r.model);
    free(ids);
    free(text);
    return 0;
}

typedef struct {
    llama_token id;
    float logit;
} cand_t;

/* top-K by logit, ties broken by the lower id; returns the argmax in best[0] */
static void topk(const float * logits, int n_vocab, cand_t * best, int k) {
    for (int j = 0; j < k; j++) {
        best[j].id = -1;
        best[j].logit = -INFINITY;
    }
    for (int t = 0; t < n_vocab; t++) {
        float v = logits[t];
        if (best[k - 1].id >= 0 && !(v > best[k - 1].logit)) {
            continue;
        }
        int j = k - 1;
        while (j > 0 && (best[j - 1].id < 0 || v > best[j - 1].logit)) {
            best[j] = best[j - 1];
            j--;
        }
        best[j].id = t;
        best[j].logit = v;
    }
}

static int mode_greedy(int argc, char ** argv) {
    if (argc != 8) {
        die("usage: %s greedy MODEL CTX N_THREADS N_PREDICT PROMPT_FILE OUT_JSON", argv[0]);
    }
    const char * model_path = argv[2];
    int n_ctx = atoi(argv[3]);
    int n_threads = atoi(argv[4]);
    int n_predict = atoi(argv[5]);
    size_t len;
    char * text = read_file(argv[6], &len);

    ref_t r = {0};
    r.model = load_model(model_path);
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    if (llama_model_has_encoder(r.model)) {
        die("encoder-decoder models are not supported by greedy mode");
    }

    int n_prompt;
    llama_token * prompt = tokenize(r.vocab, text, len, &n_prompt);
    if (n_prompt == 0) {
        die("the prompt tokenizes to nothing");
    }
    if (n_prompt + n_predict > n_ctx) {
        die("prompt (%d) + n_predict (%d) exceeds CTX %d", n_prompt, n_predict, n_ctx);
    }
    /* defaults except n_ctx / threads; n_batch defaults to 2048 and is clamped to n_ctx for
     * causal models, so it is always >= the prompt length here. */
    make_ctx(&r, (uint32_t) n_ctx, n_threads, 0);
    if ((int) llama_n_batch(r.ctx) < n_prompt) {
        die("n_batch %u < prompt length %d", llama_n_batch(r.ctx), n_prompt);
    }

    llama_token * gen = malloc(sizeof(llama_token) * (n_predict > 0 ? n_predict : 1));
    cand_t * tops = malloc(sizeof(cand_t) * TOPK * (n_predict > 0 ? n_predict : 1));
    int first_eog = -1;

    struct llama_batch batch = llama_batch_init(n_prompt > 1 ? n_prompt : 1, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i] = prompt[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = (i == n_prompt - 1);
    }
    batch.n_tokens = n_prompt;
    int pos = n_prompt;
    for (int step = 0; step < n_predict; step++) {
        int rc = llama_decode(r.ctx, batch);
        if (rc != 0) {
            die("llama_decode failed at step %d: %d", step, rc);
        }
        const float * row = llama_get_logits_ith(r.ctx, -1);
        if (!row) {
            die("no logits at step %d", step);
        }
        cand_t * best = tops + (size_t) step * TOPK;
        topk(row, r.n_vocab, best, TOPK);
        llama_token next = best[0].id;
        gen[step] = next;
        if (first_eog < 0 && llama_vocab_is_eog(r.vocab, next)) {
            first_eog = step;
        }
        batch.token[0] = next;
        batch.pos[0] = pos++;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0] = 1;
        batch.n_tokens = 1;
    }

    FILE * f = fopen(argv[7], "wb");
    if (!f) {
        die("cannot create %s", argv[7]);
    }
    fprintf(f, "{\"settings\": ");
    write_settings(f, &r, "greedy");
    fprintf(f, ",\n \"tokenize\": {\"add_special\": true, \"parse_special\": true}");
    fprintf(f, ",\n \"prompt_ids\": [");
    for (int i = 0; i < n_prompt; i++) {
        fprintf(f, "%s%d", i ? ", " : "", prompt[i]);
    }
    fprintf(f, "],\n \"generated\": [");
    for (int i = 0; i < n_predict; i++) {
        fprintf(f, "%s%d", i ? ", " : "", gen[i]);
    }
    fprintf(f, "],\n \"first_eog_index\": ");
    if (first_eog >= 0) {
        fprintf(f, "%d", first_eog);
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n \"top2_gap\": [");
    for (int i = 0; i < n_predict; i++) {
        const cand_t * b = tops + (size_t) i * TOPK;
        fprintf(f, "%s%.9g", i ? ", " : "", (double) (b[0].logit - b[1].logit));
    }
    fprintf(f, "],\n \"top5\": [");
    for (int i = 0; i < n_predict; i++) {
        const cand_t * b = tops + (size_t) i * TOPK;
        fprintf(f, "%s\n  [", i ? "," : "");
        for (int j = 0; j < TOPK; j++) {
            fprintf(f, "%s[%d, %.9g]", j ? ", " : "", b[j].id, (double) b[j].logit);
        }
        fprintf(f, "]");
    }
    fprintf(f, "],\n \"pieces\": [");
    for (int i = 0; i < n_predict; i++) {
        char buf[256];
        int n = llama_token_to_piece(r.vocab, gen[i], buf, sizeof(buf), 0, true);
        if (n < 0) {
            n = 0;
        }
        fprintf(f, "%s", i ? ", " : "");
        json_str(f, buf, n);
    }
    fprintf(f, "],\n \"generated_text\": ");
    {
        int cap = 64 * (n_predict + 1);
        char * buf = malloc((size_t) cap);
        int n = llama_detokenize(r.vocab, gen, n_predict, buf, cap, false, true);
        if (n < 0) {
            cap = -n;
            buf = realloc(buf, (size_t) cap);
            n = llama_detokenize(r.vocab, gen, n_predict, buf, cap, false, true);
        }
        json_str(f, buf, n < 0 ? 0 : n);
        free(buf);
    }
    fprintf(f, "}\n");
    fclose(f);

    llama_batch_free(batch);
    llama_free(r.ctx);
    llama_model_free(r.model);
    free(prompt);
    free(gen);
    free(tops);
    free(text);
    return 0;
}

/* the TOPK best [id, logprob] pairs of a row, as JSON */
static void write_top_logprobs(FILE * f, const float * row, int n_vocab) {
    cand_t best[TOPK];
    topk(row, n_vocab, best, TOPK);
    double sum = 0.0;
    for (int t = 0; t < n_vocab; t++) {
        sum += exp((double) row[t] - (double) best[0].logit);
    }
    double lse = (double) best[0].logit + log(sum);
    fprintf(f, "[");
    for (int j = 0; j < TOPK; j++) {
        fprintf(f, "%s[%d, %.8g]", j ? ", " : "", best[j].id, (double) best[j].logit - lse);
    }
    fprintf(f, "]");
}

static void decode_or_die(struct llama_context * ctx, struct llama_batch batch, const char * what, int at) {
    int rc = llama_decode(ctx, batch);
    if (rc != 0) {
        die("llama_decode failed (%s %d): %d", what, at, rc);
    }
}

static int mode_sweep(int argc, char ** argv) {
    if (argc != 8) {
        die("usage: %s sweep MODEL CTX N_THREADS TOKENS_FILE N_GREEDY OUT_JSON", argv[0]);
    }
    int n_ctx = atoi(argv[3]);
    int n_threads = atoi(argv[4]);
    size_t len;
    char * text = read_file(argv[5], &len);
    int n_tokens;
    llama_token * ids = parse_ids(text, &n_tokens);
    int n_greedy = atoi(argv[6]);
    if (n_tokens == 0 || n_greedy < 0) {
        die("no token ids in %s, or a negative N_GREEDY", argv[5]);
    }
    if (n_ctx < n_tokens + n_greedy) {
        die("CTX %d < %d tokens + %d greedy", n_ctx, n_tokens, n_greedy);
    }
    ref_t r = {0};
    r.model = load_model(argv[2]);
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    for (int i = 0; i < n_tokens; i++) {
        if (ids[i] < 0 || ids[i] >= r.n_vocab) {
            die("token id %d out of range (n_vocab %d)", ids[i], r.n_vocab);
        }
    }
    make_ctx(&r, (uint32_t) n_ctx, n_threads, n_tokens);
    llama_memory_t mem = llama_get_memory(r.ctx);
    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    FILE * f = fopen(argv[7], "wb");
    if (!f) {
        die("cannot create %s", argv[7]);
    }
    fprintf(f, "{\"settings\": ");
    write_settings(f, &r, "sweep");
    fprintf(f, ",\n \"tokens\": [");
    for (int i = 0; i < n_tokens; i++) {
        fprintf(f, "%s%d", i ? ", " : "", ids[i]);
    }
    fprintf(f, "],\n \"all\": [");
    for (int i = 0; i < n_tokens; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_tokens;
    decode_or_die(r.ctx, batch, "all", n_tokens);
    for (int i = 0; i < n_tokens; i++) {
        fprintf(f, "%s\n  ", i ? "," : "");
        write_top_logprobs(f, llama_get_logits_ith(r.ctx, i), r.n_vocab);
    }
    fprintf(f, "],\n \"prompt\": [");
    char * greedy = NULL;
    size_t greedy_len = 0;
    FILE * g = open_memstream(&greedy, &greedy_len);
    for (int p = 1; p <= n_tokens; p++) {
        llama_memory_clear(mem, true);
        for (int i = 0; i < p; i++) {
            batch.logits[i] = (i == p - 1);
        }
        batch.n_tokens = p;
        decode_or_die(r.ctx, batch, "prompt", p);
        const float * row = llama_get_logits_ith(r.ctx, -1);
        fprintf(f, "%s\n  ", p > 1 ? "," : "");
        write_top_logprobs(f, row, r.n_vocab);
        fprintf(g, "%s\n  {\"ids\": [", p > 1 ? "," : "");
        llama_token gen[4096];
        char * tops = NULL;
        size_t tops_len = 0;
        FILE * t = open_memstream(&tops, &tops_len);
        for (int step = 0; step < n_greedy && step < 4096; step++) {
            cand_t best[TOPK];
            topk(row, r.n_vocab, best, TOPK);
            gen[step] = best[0].id;
            fprintf(g, "%s%d", step ? ", " : "", gen[step]);
            struct llama_batch one = llama_batch_get_one(&gen[step], 1);
            decode_or_die(r.ctx, one, "greedy", step);
            row = llama_get_logits_ith(r.ctx, -1);
            fprintf(t, "%s", step ? ", " : "");
            write_top_logprobs(t, row, r.n_vocab);
        }
        fclose(t);
        fprintf(g, "], \"top5\": [%s]}", tops ? tops : "");
        free(tops);
        /* restore the batch for the next prompt */
        for (int i = 0; i < n_tokens; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = i;
        }
    }
    fclose(g);
    fprintf(f, "],\n \"greedy\": [%s]}\n", greedy ? greedy : "");
    free(greedy);
    fclose(f);
    llama_batch_free(batch);
    llama_free(r.ctx);
    llama_model_free(r.model);
    free(ids);
    free(text);
    return 0;
}

static int mode_tokenize(int argc, char ** argv) {
    if (argc != 4) {
        die("usage: %s tokenize MODEL PROMPT_FILE", argv[0]);
    }
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[2], mp);
    if (!model) {
        die("unable to load model %s", argv[2]);
    }
    size_t len;
    char * text = read_file(argv[3], &len);
    int n;
    llama_token * ids = tokenize(llama_model_get_vocab(model), text, len, &n);
    printf("[");
    for (int i = 0; i < n; i++) {
        printf("%s%d", i ? ", " : "", ids[i]);
    }
    printf("]\n");
    free(ids);
    free(text);
    llama_model_free(model);
    return 0;
}

static int mode_embed(int argc, char ** argv) {
    if (argc != 8) {
        die("usage: %s embed MODEL CTX N_THREADS POOLING TOKENS_FILE OUT_JSON", argv[0]);
    }
    const char * names[] = {"none", "mean", "cls", "last", "rank"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(argv[5], names[i]) == 0) {
            g_embed_pooling = i;
        }
    }
    if (g_embed_pooling == -2) {
        die("unknown pooling %s", argv[5]);
    }
    int n_ctx = atoi(argv[3]);
    ref_t r = {0};
    r.model = load_model(argv[2]);
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    make_ctx(&r, (uint32_t) n_ctx, atoi(argv[4]), n_ctx);
    /* rank pooling gives the classification head's scores: the first is the one llama-server
       reports (the number of labels is not in the public API) */
    const int n_embd = g_embed_pooling == 4 ? 1 : llama_model_n_embd_out(r.model);
    size_t len;
    char * text = read_file(argv[6], &len);
    FILE * f = fopen(argv[7], "w");
    if (!f) {
        die("cannot create %s", argv[7]);
    }
    fprintf(f, "{\"settings\": ");
    write_settings(f, &r, "embed");
    fprintf(f, ",\n \"pooling\": \"%s\", \"n_embd\": %d, \"embeddings\": [", argv[5], n_embd);
    struct llama_batch batch = llama_batch_init(n_ctx, 0, 1);
    int line_no = 0;
    for (char * line = text; line && *line;) {
        char * end = strchr(line, '\n');
        if (end) {
            *end = 0;
        }
        int n_tokens;
        llama_token * ids = parse_ids(line, &n_tokens);
        if (n_tokens > 0) {
            if (n_tokens > n_ctx) {
                die("a line of %d tokens exceeds CTX %d", n_tokens, n_ctx);
            }
            llama_memory_clear(llama_get_memory(r.ctx), true);
            for (int i = 0; i < n_tokens; i++) {
                batch.token[i] = ids[i];
                batch.pos[i] = i;
                batch.n_seq_id[i] = 1;
                batch.seq_id[i][0] = 0;
                batch.logits[i] = 1;
            }
            batch.n_tokens = n_tokens;
            int rc = llama_decode(r.ctx, batch);
            if (rc != 0) {
                die("llama_decode failed: %d", rc);
            }
            fprintf(f, "%s\n  [", line_no++ ? "," : "");
            int rows = g_embed_pooling == 0 ? n_tokens : 1;
            for (int t = 0; t < rows; t++) {
                const float * e = g_embed_pooling == 0 ? llama_get_embeddings_ith(r.ctx, t)
                                                       : llama_get_embeddings_seq(r.ctx, 0);
                if (!e) {
                    die("no embedding for line %d", line_no);
                }
                fprintf(f, "%s[", t ? ", " : "");
                for (int i = 0; i < n_embd; i++) {
                    fprintf(f, "%s%.9g", i ? ", " : "", e[i]);
                }
                fprintf(f, "]");
            }
            fprintf(f, "]");
        }
        free(ids);
        line = end ? end + 1 : NULL;
    }
    fprintf(f, "]}\n");
    fclose(f);
    llama_batch_free(batch);
    llama_free(r.ctx);
    llama_model_free(r.model);
    free(text);
    return 0;
}

static int mode_info(int argc, char ** argv) {
    if (argc != 5) {
        die("usage: %s info MODEL CTX N_THREADS", argv[0]);
    }
    ref_t r = {0};
    r.model = load_model(argv[2]);
    r.vocab = llama_model_get_vocab(r.model);
    r.n_vocab = llama_vocab_n_tokens(r.vocab);
    make_ctx(&r, (uint32_t) atoi(argv[3]), atoi(argv[4]), 0);
    write_settings(stdout, &r, "info");
    printf("\n");
    llama_free(r.ctx);
    llama_model_free(r.model);
    return 0;
}

int main(int argc, char ** argv) {
    setlocale(LC_NUMERIC, "C");
    const char * v = getenv("LLAMA_REF_VERBOSE");
    g_verbose = v && *v && strcmp(v, "0") != 0;
    llama_log_set(log_cb, NULL);
    llama_backend_init();
    if (argc < 2) {
        die("usage: %s logits|greedy|sweep|tokenize|info|embed ...", argv[0]);
    }
    int rc;
    if (strcmp(argv[1], "logits") == 0) {
        rc = mode_logits(argc, argv);
    } else if (strcmp(argv[1], "greedy") == 0) {
        rc = mode_greedy(argc, argv);
    } else if (strcmp(argv[1], "sweep") == 0) {
        rc = mode_sweep(argc, argv);
    } else if (strcmp(argv[1], "tokenize") == 0) {
        rc = mode_tokenize(argc, argv);
    } else if (strcmp(argv[1], "info") == 0) {
        rc = mode_info(argc, argv);
    } else if (strcmp(argv[1], "embed") == 0) {
        rc = mode_embed(argc, argv);
    } else {
        die("unknown mode %s", argv[1]);
    }
    llama_backend_free();
    return rc;
}
