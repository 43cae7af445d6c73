/*
 * mtmd-ref: a small reference program against llama.cpp's multimodal C API (tools/mtmd/mtmd.h,
 * mtmd-helper.h) and include/llama.h, used to produce the image-input reference fixtures that
 * Ferrox is tested against (fixtures/vision/). Our own code; it only calls llama.cpp's public
 * API. Build with scripts/reference/build.sh (which builds llama-ref too).
 *
 * Modes (all numbers are decimal):
 *
 *   mtmd-ref embed MODEL MMPROJ IMAGE N_THREADS OUT
 *       The image's embeddings as the projector outputs them: the bitmap is read with
 *       mtmd_helper_bitmap_init_from_file (stb_image, forced to RGB), the prompt
 *       mtmd_default_marker() alone is tokenized with mtmd_tokenize (add_special and
 *       parse_special true), the image chunk is encoded with mtmd_encode_chunk and
 *       mtmd_get_output_embd is written to OUT as raw little-endian f32, row-major
 *       [n_tokens][n_embd] (n_embd = llama_model_n_embd_inp of MODEL). Prints one JSON line:
 *       settings, the bitmap's size, the chunks, and the image chunk's n_tokens, n_pos, nx, ny.
 *       No llama_context is made: the text model only provides the vocabulary and the width.
 *       MTMD_REF_REPEAT=N (N > 0) times the encoding: the first mtmd_encode_chunk as a warm-up,
 *       then N more, each timed on its own (CLOCK_MONOTONIC); the JSON line then ends with
 *       "warmup_ms" and "encode_ms" (the N times, in milliseconds), OUT holds the last
 *       encoding's embeddings. Unset or 0: one encoding, nothing timed.
 *
 *   mtmd-ref greedy MODEL MMPROJ IMAGE[,IMAGE...] N_THREADS N_PREDICT PROMPT_FILE OUT_JSON
 *       Tokenizes the bytes of PROMPT_FILE, which holds mtmd's default media marker, with
 *       mtmd_tokenize (add_special true, so BOS is prepended; parse_special true), evaluates
 *       every chunk with mtmd_helper_eval_chunks (text chunks as token batches; the image chunk
 *       encoded, then decoded as one embedding batch with causal attention switched off, which
 *       is what mtmd_decode_use_non_causal asks for Gemma 3), logits for the last position,
 *       then decodes N_PREDICT tokens greedily, one per llama_decode call. Greedy = argmax of
 *       the raw logits, the lowest id wins a tie; end-of-generation tokens do NOT stop the
 *       loop (the index of the first one is recorded). Writes {"settings", "prompt", "chunks",
 *       "n_past", "generated", "first_eog_index", "top5", "pieces", "generated_text"} to
 *       OUT_JSON: each chunk with its type, start position and n_pos (text: "ids" and
 *       "pieces"; image: n_tokens, nx, ny and the decoder positions of its tokens);
 *       top5[i] = the five best [id, logprob] at step i, logprob = logit minus the
 *       log-sum-exp of the row in double precision.
 *
 * Settings: CPU only; the projector with flash attention off (mtmd_context_params
 * flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED, passed on to the clip context), so f32
 * results depend on summation order only. greedy's llama_context: n_ctx 512, n_batch = n_ubatch
 * = 512 (the whole image in one batch), f32 K and V cache, flash attention off, llama.cpp's
 * defaults otherwise. MTMD_REF_DEFAULTS=1 instead keeps llama.cpp's defaults for both (flash
 * attention AUTO, f16 K and V cache), as llama-mtmd-cli runs. MTMD_REF_IMAGE_MIN_TOKENS=N and
 * MTMD_REF_IMAGE_MAX_TOKENS=N set the projector's token limits (llama.cpp's --image-min-tokens
 * and --image-max-tokens; dynamic-size projectors only). MTMD_REF_VERBOSE=1 shows
 * llama.cpp's log on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include "llama.h"
#include "ggml.h"
#include "mtmd.h"
#include "mtmd-helper.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOPK 5
#define N_CTX 512

static int g_verbose = 0;
static int g_defaults = 0;
static int g_repeat = 0;

static void log_cb(enum ggml_log_level level, const char * text, void * user) {
    (void) level;
    (void) user;
    if (g_verbose) {
        fputs(text, stderr);
    }
}

static void die(const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mtmd-ref: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static char * read_file(const char * path) {
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
    return buf;
}

/* JSON string of arbitrary bytes: control characters and stray (non-UTF-8) bytes as \u00XX */
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
                    /* well-formed UTF-8 only: no overlong forms, surrogates or code points
                       past U+10FFFF */
                    int len = (c >= 0xf0 && c <= 0xf4) ? 4 : (c >= 0xe0 && c < 0xf0) ? 3 : (c >= 0xc2 && c < 0xe0) ? 2 : 0;
                    int ok = len > 0 && i + len <= n;
                    for (int k = 1; ok && k < len; k++) {
                        ok = (((unsigned char) s[i + k]) & 0xc0) == 0x80;
                    }
                    if (ok && len > 2) {
                        unsigned char c1 = (unsigned char) s[i + 1];
                        ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) &&
                             !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
                    }
                    if (ok) {
                        fwrite(s + i, 1, len, f);
                        i += len - 1;
                    } else {
                        fprintf(f, "\\u%04x", c);
                    }
                } else {
                    fputc(c, f);
                }
        }
    }
    fputc('"', f);
}

static void json_cstr(FILE * f, const char * s) {
    json_str(f, s, (int) strlen(s));
}

static void json_piece(FILE * f, const struct llama_vocab * vocab, llama_token id) {
    char buf[256];
    int n = llama_token_to_piece(vocab, id, buf, sizeof buf, 0, true);
    json_str(f, buf, n < 0 ? 0 : n);
}

static struct llama_model * load_model(const char * path) {
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) {
        die("unable to load model %s", path);
    }
    return model;
}

static enum llama_flash_attn_type fa_type(void) {
    return g_defaults ? LLAMA_FLASH_ATTN_TYPE_AUTO : LLAMA_FLASH_ATTN_TYPE_DISABLED;
}

static mtmd_context * load_mmproj(const char * path, const struct llama_model * model, int n_threads) {
    struct mtmd_context_params p = mtmd_context_params_default();
    p.use_gpu = false;
    p.print_timings = false;
    p.n_threads = n_threads;
    p.flash_attn_type = fa_type();
    const char * lo = getenv("MTMD_REF_IMAGE_MIN_TOKENS");
    const char * hi = getenv("MTMD_REF_IMAGE_MAX_TOKENS");
    if (lo) {
        p.image_min_tokens = atoi(lo);
    }
    if (hi) {
        p.image_max_tokens = atoi(hi);
    }
    mtmd_context * ctx = mtmd_init_from_file(path, model, p);
    if (!ctx) {
        die("unable to load mmproj %s", path);
    }
    return ctx;
}

static mtmd_bitmap * load_image(mtmd_context * ctx, const char * path, uint32_t * nx, uint32_t * ny) {
    struct mtmd_helper_bitmap_wrapper w =
        mtmd_helper_bitmap_init_from_file(ctx, path, false, mtmd_helper_init_opt_default());
    if (!w.bitmap) {
        die("unable to load image %s", path);
    }
    *nx = mtmd_bitmap_get_nx(w.bitmap);
    *ny = mtmd_bitmap_get_ny(w.bitmap);
    return w.bitmap;
}

static mtmd_input_chunks * tokenize_many(mtmd_context * ctx, const char * prompt, const mtmd_bitmap ** bitmaps,
                                         size_t n_bitmaps) {
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    struct mtmd_input_text text = { prompt, strlen(prompt), true, true };
    int32_t rc = mtmd_tokenize(ctx, chunks, &text, bitmaps, n_bitmaps);
    if (rc != 0) {
        die("mtmd_tokenize failed (%d)", rc);
    }
    return chunks;
}

static mtmd_input_chunks * tokenize(mtmd_context * ctx, const char * prompt, const mtmd_bitmap * bitmap) {
    mtmd_input_chunks * chunks = mtmd_input_chunks_init();
    struct mtmd_input_text text = { prompt, strlen(prompt), true, true };
    const mtmd_bitmap * bitmaps[1] = { bitmap };
    int32_t rc = mtmd_tokenize(ctx, chunks, &text, bitmaps, 1);
    if (rc != 0) {
        die("mtmd_tokenize failed (%d)", rc);
    }
    return chunks;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static size_t image_nx(const mtmd_image_tokens * t) { return mtmd_image_tokens_get_nx(t); }
static size_t image_ny(const mtmd_image_tokens * t) { return mtmd_image_tokens_get_ny(t); }
#pragma GCC diagnostic pop

/* the chunks as a JSON array; text chunks with ids (and pieces when `pieces`), image chunks with
   n_tokens, nx, ny and (when `positions`) their tokens' decoder positions (t) */
static void write_chunks(FILE * f, const mtmd_input_chunks * chunks, const struct llama_vocab * vocab, int detail) {
    llama_pos pos = 0;
    fputc('[', f);
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        llama_pos n_pos = mtmd_input_chunk_get_n_pos(c);
        fprintf(f, "%s{\"pos\": %d, \"n_pos\": %d, ", i ? ", " : "", pos, n_pos);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token * ids = mtmd_input_chunk_get_tokens_text(c, &n);
            fprintf(f, "\"type\": \"text\", \"ids\": [");
            for (size_t k = 0; k < n; k++) {
                fprintf(f, "%s%d", k ? ", " : "", ids[k]);
            }
            fputc(']', f);
            if (detail) {
                fprintf(f, ", \"pieces\": [");
                for (size_t k = 0; k < n; k++) {
                    if (k) {
                        fputs(", ", f);
                    }
                    json_piece(f, vocab, ids[k]);
                }
                fputc(']', f);
            }
        } else {
            const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(c);
            size_t n = mtmd_input_chunk_get_n_tokens(c);
            fprintf(f, "\"type\": \"%s\", \"n_tokens\": %zu",
                    mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE ? "image" : "audio", n);
            if (img) {
                fprintf(f, ", \"nx\": %zu, \"ny\": %zu", image_nx(img), image_ny(img));
                if (detail) {
                    fprintf(f, ", \"decoder_pos_t\": [");
                    for (size_t k = 0; k < n; k++) {
                        struct mtmd_decoder_pos p = mtmd_image_tokens_get_decoder_pos(img, pos, k);
                        fprintf(f, "%s%u", k ? ", " : "", p.t);
                    }
                    fputc(']', f);
                }
            }
        }
        fputc('}', f);
        pos += n_pos;
    }
    fputc(']', f);
}

static void write_common_settings(FILE * f, const char * mode, const struct llama_model * model,
                                  const char * mmproj, const char * image, int n_threads) {
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    fprintf(f, "{\"mode\": \"%s\", \"llama_version\": ", mode);
    json_cstr(f, llama_version());
    fprintf(f, ", \"ggml_version\": ");
    json_cstr(f, ggml_version());
    fprintf(f, ", \"ggml_commit\": ");
    json_cstr(f, ggml_commit());
    fprintf(f, ", \"model_desc\": ");
    json_cstr(f, desc);
    fprintf(f, ", \"mmproj\": ");
    json_cstr(f, mmproj);
    fprintf(f, ", \"image\": ");
    json_cstr(f, image);
    fprintf(f, ", \"n_threads\": %d, \"media_marker\": ", n_threads);
    json_cstr(f, mtmd_default_marker());
    fprintf(f, ", \"mmproj_flash_attn_type\": \"%s\"", llama_flash_attn_type_name(fa_type()));
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

/* mtmd_encode_chunk, timed; dies on failure */
static double encode_timed(mtmd_context * mctx, const mtmd_input_chunk * image) {
    double start = now_ms();
    if (mtmd_encode_chunk(mctx, image) != 0) {
        die("mtmd_encode_chunk failed");
    }
    return now_ms() - start;
}

static int cmd_embed(int argc, char ** argv) {
    if (argc != 7) {
        die("usage: mtmd-ref embed MODEL MMPROJ IMAGE N_THREADS OUT");
    }
    const char * model_path = argv[2];
    const char * mmproj_path = argv[3];
    const char * image_path = argv[4];
    int n_threads = atoi(argv[5]);
    const char * out_path = argv[6];

    struct llama_model * model = load_model(model_path);
    mtmd_context * mctx = load_mmproj(mmproj_path, model, n_threads);
    uint32_t bnx, bny;
    mtmd_bitmap * bitmap = load_image(mctx, image_path, &bnx, &bny);
    mtmd_input_chunks * chunks = tokenize(mctx, mtmd_default_marker(), bitmap);

    const mtmd_input_chunk * image = NULL;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk * c = mtmd_input_chunks_get(chunks, i);
        if (mtmd_input_chunk_get_type(c) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            image = c;
        }
    }
    if (!image) {
        die("no image chunk");
    }
    double warmup_ms = encode_timed(mctx, image);
    double * encode_ms = malloc(sizeof(double) * (g_repeat > 0 ? g_repeat : 1));
    for (int i = 0; i < g_repeat; i++) {
        encode_ms[i] = encode_timed(mctx, image);
    }
    const float * embd = mtmd_get_output_embd(mctx);
    size_t n_tokens = mtmd_input_chunk_get_n_tokens(image);
    int n_embd = llama_model_n_embd_inp(model);

    FILE * out = fopen(out_path, "wb");
    if (!out) {
        die("cannot write %s", out_path);
    }
    if (fwrite(embd, sizeof(float), n_tokens * (size_t) n_embd, out) != n_tokens * (size_t) n_embd) {
        die("short write to %s", out_path);
    }
    fclose(out);

    double sum = 0.0, sum_sq = 0.0, max_abs = 0.0;
    int n_nonfinite = 0;
    for (size_t i = 0; i < n_tokens * (size_t) n_embd; i++) {
        double v = embd[i];
        if (!isfinite(v)) {
            n_nonfinite++;
            continue;
        }
        sum += v;
        sum_sq += v * v;
        max_abs = fabs(v) > max_abs ? fabs(v) : max_abs;
    }
    double n = (double) n_tokens * n_embd;

    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    write_common_settings(stdout, "embed", model, mmproj_path, image_path, n_threads);
    fprintf(stdout, ", \"bitmap_nx\": %u, \"bitmap_ny\": %u", bnx, bny);
    fprintf(stdout, ", \"chunks\": ");
    write_chunks(stdout, chunks, vocab, 0);
    const mtmd_image_tokens * img = mtmd_input_chunk_get_tokens_image(image);
    fprintf(stdout, ", \"n_tokens\": %zu, \"n_pos\": %d, \"nx\": %zu, \"ny\": %zu, \"n_embd\": %d",
            n_tokens, mtmd_input_chunk_get_n_pos(image), image_nx(img), image_ny(img), n_embd);
    fprintf(stdout, ", \"out\": ");
    json_cstr(stdout, out_path);
    fprintf(stdout, ", \"mean\": %.9g, \"rms\": %.9g, \"max_abs\": %.9g, \"n_nonfinite\": %d",
            sum / n, sqrt(sum_sq / n), max_abs, n_nonfinite);
    if (g_repeat > 0) {
        fprintf(stdout, ", \"warmup_ms\": %.3f, \"encode_ms\": [", warmup_ms);
        for (int i = 0; i < g_repeat; i++) {
            fprintf(stdout, "%s%.3f", i ? ", " : "", encode_ms[i]);
        }
        fputc(']', stdout);
    }
    fprintf(stdout, "}\n");
    free(encode_ms);

    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bitmap);
    mtmd_free(mctx);
    llama_model_free(model);
    return n_nonfinite ? 1 : 0;
}

/* argmax (lowest id on ties) and the five best [id, logprob] of one logit row */
static llama_token top5(const float * logits, int n_vocab, llama_token ids[TOPK], double lp[TOPK]) {
    double max = -INFINITY;
    for (int i = 0; i < n_vocab; i++) {
        if (logits[i] > max) {
            max = logits[i];
        }
    }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) {
        sum += exp((double) logits[i] - max);
    }
    double lse = max + log(sum);
    for (int k = 0; k < TOPK; k++) {
        ids[k] = -1;
    }
    for (int i = 0; i < n_vocab; i++) {
        for (int k = 0; k < TOPK; k++) {
            /* strictly greater: the lower id stays ahead on ties */
            if (ids[k] < 0 || logits[i] > logits[ids[k]]) {
                for (int j = TOPK - 1; j > k; j--) {
                    ids[j] = ids[j - 1];
                }
                ids[k] = i;
                break;
            }
        }
    }
    for (int k = 0; k < TOPK; k++) {
        lp[k] = (double) logits[ids[k]] - lse;
    }
    return ids[0];
}

static int cmd_greedy(int argc, char ** argv) {
    if (argc != 9) {
        die("usage: mtmd-ref greedy MODEL MMPROJ IMAGE N_THREADS N_PREDICT PROMPT_FILE OUT_JSON");
    }
    const char * model_path = argv[2];
    const char * mmproj_path = argv[3];
    const char * image_path = argv[4];
    int n_threads = atoi(argv[5]);
    int n_predict = atoi(argv[6]);
    char * prompt = read_file(argv[7]);
    const char * out_path = argv[8];

    struct llama_model * model = load_model(model_path);
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    mtmd_context * mctx = load_mmproj(mmproj_path, model, n_threads);
    /* IMAGE may list several files, comma-separated, one per media marker in order */
    enum { MAX_IMAGES = 8 };
    mtmd_bitmap * bitmaps[MAX_IMAGES];
    size_t n_images = 0;
    uint32_t bnx = 0, bny = 0;
    {
        char * list = strdup(image_path);
        for (char * path = strtok(list, ","); path; path = strtok(NULL, ",")) {
            if (n_images == MAX_IMAGES) {
                die("at most %d images", MAX_IMAGES);
            }
            uint32_t nx, ny;
            bitmaps[n_images] = load_image(mctx, path, &nx, &ny);
            if (n_images == 0) {
                bnx = nx;
                bny = ny;
            }
            n_images++;
        }
        free(list);
    }
    mtmd_input_chunks * chunks = tokenize_many(mctx, prompt, (const mtmd_bitmap **) bitmaps, n_images);

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = N_CTX;
    cp.n_batch = N_CTX;
    cp.n_ubatch = N_CTX;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    if (!g_defaults) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context * lctx = llama_init_from_model(model, cp);
    if (!lctx) {
        die("failed to create the llama_context");
    }

    llama_pos n_past = 0;
    if (mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, (int32_t) cp.n_batch, true, &n_past) != 0) {
        die("mtmd_helper_eval_chunks failed");
    }
    llama_pos prompt_n_past = n_past;

    llama_token * gen = malloc(sizeof(llama_token) * (n_predict > 0 ? n_predict : 1));
    llama_token (*best)[TOPK] = malloc(sizeof(*best) * (n_predict > 0 ? n_predict : 1));
    double (*best_lp)[TOPK] = malloc(sizeof(*best_lp) * (n_predict > 0 ? n_predict : 1));
    int first_eog = -1;
    struct llama_batch batch = llama_batch_init(1, 0, 1);
    for (int i = 0; i < n_predict; i++) {
        const float * logits = llama_get_logits_ith(lctx, -1);
        if (!logits) {
            die("no logits at step %d", i);
        }
        llama_token id = top5(logits, n_vocab, best[i], best_lp[i]);
        gen[i] = id;
        if (first_eog < 0 && llama_vocab_is_eog(vocab, id)) {
            first_eog = i;
        }
        if (i + 1 == n_predict) {
            break;
        }
        batch.n_tokens = 1;
        batch.token[0] = id;
        batch.pos[0] = n_past;
        batch.n_seq_id[0] = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0] = 1;
        if (llama_decode(lctx, batch) != 0) {
            die("llama_decode failed at step %d", i);
        }
        n_past++;
    }
    llama_batch_free(batch);

    FILE * f = fopen(out_path, "w");
    if (!f) {
        die("cannot write %s", out_path);
    }
    fprintf(f, "{\"settings\": ");
    write_common_settings(f, "greedy", model, mmproj_path, image_path, n_threads);
    fprintf(f, ", \"n_vocab\": %d, \"n_ctx\": %u, \"n_batch\": %u, \"n_ubatch\": %u", n_vocab,
            llama_n_ctx(lctx), llama_n_batch(lctx), llama_n_ubatch(lctx));
    fprintf(f, ", \"flash_attn_type\": \"%s\", \"type_k\": \"%s\", \"type_v\": \"%s\"",
            llama_flash_attn_type_name(cp.flash_attn_type), ggml_type_name(cp.type_k), ggml_type_name(cp.type_v));
    fprintf(f, ", \"llama_defaults\": %s, \"bitmap_nx\": %u, \"bitmap_ny\": %u, \"n_predict\": %d}",
            g_defaults ? "true" : "false", bnx, bny, n_predict);
    fprintf(f, ",\n \"prompt\": ");
    json_cstr(f, prompt);
    fprintf(f, ",\n \"chunks\": ");
    write_chunks(f, chunks, vocab, 1);
    fprintf(f, ",\n \"n_past\": %d", prompt_n_past);
    fprintf(f, ",\n \"generated\": [");
    for (int i = 0; i < n_predict; i++) {
        fprintf(f, "%s%d", i ? ", " : "", gen[i]);
    }
    fprintf(f, "],\n \"first_eog_index\": %d", first_eog);
    fprintf(f, ",\n \"top5\": [");
    for (int i = 0; i < n_predict; i++) {
        fprintf(f, "%s[", i ? ",\n  " : "");
        for (int k = 0; k < TOPK; k++) {
            fprintf(f, "%s[%d, %.9g]", k ? ", " : "", best[i][k], best_lp[i][k]);
        }
        fputc(']', f);
    }
    fprintf(f, "],\n \"pieces\": [");
    for (int i = 0; i < n_predict; i++) {
        if (i) {
            fputs(", ", f);
        }
        json_piece(f, vocab, gen[i]);
    }
    fprintf(f, "],\n \"generated_text\": ");
    {
        size_t cap = 64 + (size_t) n_predict * 64;
        char * text = malloc(cap);
        int n = llama_detokenize(vocab, gen, n_predict, text, (int32_t) cap, false, true);
        json_str(f, text, n < 0 ? 0 : n);
        free(text);
    }
    fprintf(f, "}\n");
    fclose(f);

    free(gen);
    free(best);
    free(best_lp);
    free(prompt);
    llama_free(lctx);
    mtmd_input_chunks_free(chunks);
    for (size_t i = 0; i < n_images; i++) {
        mtmd_bitmap_free(bitmaps[i]);
    }
    mtmd_free(mctx);
    llama_model_free(model);
    return 0;
}

int main(int argc, char ** argv) {
    const char * v = getenv("MTMD_REF_VERBOSE");
    g_verbose = v && strcmp(v, "1") == 0;
    const char * d = getenv("MTMD_REF_DEFAULTS");
    g_defaults = d && strcmp(d, "1") == 0;
    const char * r = getenv("MTMD_REF_REPEAT");
    g_repeat = r ? atoi(r) : 0;
    llama_log_set(log_cb, NULL);
    mtmd_helper_log_set(log_cb, NULL);
    llama_backend_init();
    if (argc < 2) {
        die("usage: mtmd-ref embed|greedy ...");
    }
    int rc;
    if (strcmp(argv[1], "embed") == 0) {
        rc = cmd_embed(argc, argv);
    } else if (strcmp(argv[1], "greedy") == 0) {
        rc = cmd_greedy(argc, argv);
    } else {
        die("unknown mode %s", argv[1]);
        rc = 1;
    }
    llama_backend_free();
    return rc;
}
