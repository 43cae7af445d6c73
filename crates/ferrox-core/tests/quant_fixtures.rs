//! Bit-exactness against llama.cpp: every fixture written by `scripts/gen-quant-fixtures.py`
//! (expected values from gguf-py's numpy code or ggml's reference C, see the manifest) must
//! be reproduced exactly. A missing fixture fails the test.

use std::path::{Path, PathBuf};

use ferrox_core::{dequantize_row, quantize_row, GgmlType};

const DEQUANTIZED: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0", "TQ1_0", "NVFP4", "Q1_0", "Q2_0",
    "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S",
];
const QUANTIZED: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ2_0", "TQ1_0", "NVFP4", "Q1_0", "Q2_0",
];

const KIND_DEQUANTIZE: u32 = 0;
const KIND_QUANTIZE: u32 = 1;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant")
}

/// One fixture file: header fields plus the encoded bytes and the f32 values.
struct Fixture {
    ty: GgmlType,
    encoded: Vec<u8>,
    values: Vec<f32>,
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn load(file: &str, kind: u32) -> Fixture {
    let path = fixture_dir().join(file);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with scripts/gen-quant-fixtures.py)",
            path.display()
        )
    });
    assert!(bytes.len() >= 24, "{file}: truncated header");
    assert_eq!(&bytes[..4], b"FXQF", "{file}: bad magic");
    assert_eq!(read_u32(&bytes, 4), 1, "{file}: unknown version");
    assert_eq!(read_u32(&bytes, 8), kind, "{file}: wrong kind");
    let ty = GgmlType::from_id(read_u32(&bytes, 12));
    let n_values = read_u32(&bytes, 16) as usize;
    let n_bytes = read_u32(&bytes, 20) as usize;
    let payload = &bytes[24..];
    assert_eq!(
        payload.len(),
        n_values * 4 + n_bytes,
        "{file}: payload size"
    );
    let (encoded, floats) = if kind == KIND_DEQUANTIZE {
        (&payload[..n_bytes], &payload[n_bytes..])
    } else {
        (&payload[n_values * 4..], &payload[..n_values * 4])
    };
    let values = floats
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Fixture {
        ty,
        encoded: encoded.to_vec(),
        values,
    }
}

fn assert_fixture_type(file: &str, name: &str, fixture: &Fixture) {
    assert_eq!(
        Some(fixture.ty),
        GgmlType::from_name(name),
        "{file}: header names type {}",
        fixture.ty
    );
}

#[test]
fn dequantization_matches_reference_bit_for_bit() {
    let mut failures = Vec::new();
    for name in DEQUANTIZED {
        let file = format!("dequant-{name}.bin");
        let fixture = load(&file, KIND_DEQUANTIZE);
        assert_fixture_type(&file, name, &fixture);
        let mut out = vec![0f32; fixture.values.len()];
        dequantize_row(fixture.ty, &fixture.encoded, &mut out)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let mismatches: Vec<String> = fixture
            .values
            .iter()
            .zip(&out)
            .enumerate()
            .filter(|(_, (want, got))| !same_f32(**want, **got))
            .map(|(i, (want, got))| {
                format!(
                    "[{i}] want {want:e} ({:#010x}) got {got:e} ({:#010x})",
                    want.to_bits(),
                    got.to_bits()
                )
            })
            .collect();
        if !mismatches.is_empty() {
            failures.push(format!(
                "{file}: {} of {} values differ, first: {}",
                mismatches.len(),
                out.len(),
                mismatches[..mismatches.len().min(4)].join("; ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn quantization_matches_reference_bit_for_bit() {
    let mut failures = Vec::new();
    for name in QUANTIZED {
        let file = format!("quant-{name}.bin");
        let fixture = load(&file, KIND_QUANTIZE);
        assert_fixture_type(&file, name, &fixture);
        let mut out = vec![0xA5u8; fixture.encoded.len()];
        quantize_row(fixture.ty, &fixture.values, &mut out)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let bad: Vec<usize> = (0..out.len())
            .filter(|&i| out[i] != fixture.encoded[i])
            .collect();
        if !bad.is_empty() {
            failures.push(format!(
                "{file}: {} of {} bytes differ, first at {:?} (want {:02x?}, got {:02x?})",
                bad.len(),
                out.len(),
                &bad[..bad.len().min(8)],
                bad.iter()
                    .take(8)
                    .map(|&i| fixture.encoded[i])
                    .collect::<Vec<_>>(),
                bad.iter().take(8).map(|&i| out[i]).collect::<Vec<_>>(),
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// The manifest must account for every fixture the tests read, so each one's source is
/// documented.
#[test]
fn manifest_lists_every_fixture() {
    let manifest = std::fs::read_to_string(fixture_dir().join("manifest.json"))
        .expect("tests/fixtures/quant/manifest.json");
    let files = DEQUANTIZED
        .iter()
        .map(|n| format!("dequant-{n}.bin"))
        .chain(QUANTIZED.iter().map(|n| format!("quant-{n}.bin")));
    for file in files {
        assert!(
            manifest.contains(&format!("\"file\": \"{file}\"")),
            "manifest.json does not list {file}"
        );
    }
}

/// Equal bit patterns, except that any NaN matches a NaN (payloads are not part of the
/// contract).
fn same_f32(want: f32, got: f32) -> bool {
    if want.is_nan() {
        got.is_nan()
    } else {
        want.to_bits() == got.to_bits()
    }
}
