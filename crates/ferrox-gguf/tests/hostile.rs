//! Malformed files: each must give a typed error naming what is wrong, never a panic,
//! a hang or an allocation sized by an attacker.

mod common;

use ferrox_gguf::{GgmlType, Gguf, GgufError, GgufWriter};
use proptest::prelude::*;

fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn put_str(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

fn err(bytes: Vec<u8>) -> GgufError {
    match Gguf::from_bytes(bytes) {
        Ok(_) => panic!("malformed file was accepted"),
        Err(e) => e,
    }
}

#[test]
fn bad_magic_version_and_endianness() {
    assert!(matches!(err(b"GGU".to_vec()), GgufError::BadMagic { .. }));
    assert!(matches!(
        err(b"GGML\0\0\0\0".to_vec()),
        GgufError::BadMagic { .. }
    ));
    assert!(matches!(
        err(header(1, 0, 0)),
        GgufError::UnsupportedVersion(1)
    ));
    assert!(matches!(
        err(header(3u32.swap_bytes(), 0, 0)),
        GgufError::BigEndian
    ));
    assert!(Gguf::from_bytes(header(2, 0, 0)).is_ok());
    assert!(Gguf::from_bytes(header(3, 0, 0)).is_ok());
}

#[test]
fn huge_counts_fail_before_allocating() {
    let e = err(header(3, 0, u64::MAX));
    assert!(e.to_string().contains("metadata count"), "{e}");
    let e = err(header(3, u64::MAX / 2, 0));
    assert!(e.to_string().contains("tensor count"), "{e}");

    // A string array claiming 2^61 elements.
    let mut b = header(3, 0, 1);
    put_str(&mut b, b"k");
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 61).to_le_bytes());
    let e = err(b);
    assert!(e.to_string().contains("`k`"), "{e}");

    // A string whose length runs past the end.
    let mut b = header(3, 0, 1);
    b.extend_from_slice(&u64::MAX.to_le_bytes());
    b.extend_from_slice(&[0; 16]);
    let e = err(b);
    assert!(matches!(e, GgufError::Truncated { offset: 32, .. }), "{e}");
    assert!(e.to_string().contains("metadata entry 0 key"), "{e}");
}

#[test]
fn invalid_utf8_and_unknown_value_types() {
    let mut b = header(3, 0, 1);
    put_str(&mut b, b"k\xff");
    b.extend_from_slice(&4u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    let e = err(b);
    assert!(e.to_string().contains("UTF-8"), "{e}");

    let mut b = header(3, 0, 1);
    put_str(&mut b, b"k");
    b.extend_from_slice(&13u32.to_le_bytes());
    let e = err(b);
    assert!(e.to_string().contains("unknown value type 13"), "{e}");

    let mut b = header(3, 0, 1);
    put_str(&mut b, b"k");
    b.extend_from_slice(&7u32.to_le_bytes());
    b.push(2);
    assert!(err(b).to_string().contains("bool"));
}

#[test]
fn deep_nesting_is_refused() {
    let mut b = header(3, 0, 1);
    put_str(&mut b, b"k");
    b.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..10_000 {
        b.extend_from_slice(&9u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    let e = err(b);
    assert!(e.to_string().contains("nested"), "{e}");
}

#[test]
fn duplicate_keys_and_tensor_names() {
    let mut b = header(3, 0, 2);
    for _ in 0..2 {
        put_str(&mut b, b"k");
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(1);
    }
    assert!(err(b).to_string().contains("duplicate key"));

    let mut b = header(3, 2, 0);
    for _ in 0..2 {
        put_str(&mut b, b"t");
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    assert!(err(b).to_string().contains("duplicate tensor"));
}

/// A file with one tensor info, with the given fields; data section of `data_len` bytes.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header(3, 1, 0);
    put_str(&mut b, b"t");
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

#[test]
fn tensor_infos_are_checked_against_the_file() {
    assert!(Gguf::from_bytes(one_tensor(&[8], 0, 0, 32)).is_ok());
    // Data past the end of the file.
    let e = err(one_tensor(&[8], 0, 0, 31));
    assert!(e.to_string().contains("`t` data"), "{e}");
    let e = err(one_tensor(&[8], 0, 1 << 62, 32));
    assert!(e.to_string().contains("past the end"), "{e}");
    // Offsets must be aligned.
    assert!(err(one_tensor(&[8], 0, 4, 64))
        .to_string()
        .contains("alignment"));
    // Too many dimensions, overflowing shapes, partial blocks.
    assert!(err(one_tensor(&[1; 5], 0, 0, 32))
        .to_string()
        .contains("dimension count"));
    assert!(err(one_tensor(&[u64::MAX, 2], 0, 0, 32))
        .to_string()
        .contains("overflow"));
    assert!(err(one_tensor(&[1 << 40, 1 << 30], 0, 0, 32))
        .to_string()
        .contains("overflow"));
    assert!(err(one_tensor(&[33], 2, 0, 64))
        .to_string()
        .contains("block size"));
    assert!(err(one_tensor(&[1 << 62], 0, 0, 32))
        .to_string()
        .contains("overflow"));
}

#[test]
fn unknown_tensor_types_are_named_not_guessed() {
    let gguf = Gguf::from_bytes(one_tensor(&[32], 4, 0, 32)).unwrap();
    let t = &gguf.tensors()[0];
    assert_eq!(t.ty, GgmlType::Other(4));
    assert_eq!(t.n_bytes, None);
    let e = gguf.tensor_data(t).unwrap_err();
    assert!(e.to_string().contains("Q4_2"), "{e}");
}

#[test]
fn bad_alignment_is_refused() {
    let mut w = GgufWriter::new();
    w.set("general.alignment", 48u32);
    assert!(err(w.to_bytes()).to_string().contains("general.alignment"));
    let mut w = GgufWriter::new();
    w.set("general.alignment", 0u32);
    assert!(Gguf::from_bytes(w.to_bytes()).is_err());
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = common::sample_writer().to_bytes();
    let data_start = Gguf::from_bytes(bytes.clone()).unwrap().data_offset() as usize;
    for len in 0..bytes.len() {
        let r = Gguf::from_bytes(bytes[..len].to_vec());
        // Cutting inside the header or tensor data must fail; only the padding after the last
        // tensor's data is optional.
        if len < data_start {
            assert!(r.is_err(), "truncated to {len} bytes was accepted");
        }
    }
}

/// Exercise every accessor of a parsed file, as a loader would.
fn walk(gguf: &Gguf) {
    let meta = gguf.metadata();
    for (key, value) in meta.iter() {
        let _ = value.to_owned_value();
        let _ = meta.get_u32(key);
        let _ = meta.get_str(key);
        let _ = meta.get_f32(key);
        if let Some(a) = value.as_array() {
            let _ = a.as_slice::<u32>();
            let _ = a.as_slice::<f32>();
            let _ = a.strings().map(|s| s.count());
            let _ = a.iter().count();
        }
    }
    for t in gguf.tensors() {
        if let Ok(d) = gguf.tensor_data(t) {
            assert_eq!(Some(d.len() as u64), t.n_bytes);
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    SetByte(usize, u8),
    /// Overwrite 8 bytes with a hostile integer (counts, lengths, offsets live in u64s).
    SetU64(usize, u64),
    SetU32(usize, u32),
    Remove(usize, usize),
    Insert(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let big = prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(1 << 32),
        Just(1 << 40),
        any::<u64>(),
        0u64..100_000,
    ];
    prop_oneof![
        any::<prop::sample::Index>().prop_map(|i| Mutation::Truncate(i.index(1 << 16))),
        (any::<prop::sample::Index>(), any::<u8>())
            .prop_map(|(i, b)| Mutation::SetByte(i.index(1 << 16), b)),
        (any::<prop::sample::Index>(), big)
            .prop_map(|(i, v)| Mutation::SetU64(i.index(1 << 16), v)),
        (any::<prop::sample::Index>(), any::<u32>())
            .prop_map(|(i, v)| Mutation::SetU32(i.index(1 << 16), v)),
        (any::<prop::sample::Index>(), 1usize..64)
            .prop_map(|(i, n)| Mutation::Remove(i.index(1 << 16), n)),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(any::<u8>(), 1..32)
        )
            .prop_map(|(i, v)| Mutation::Insert(i.index(1 << 16), v)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len().max(1);
    match m {
        Mutation::Truncate(i) => bytes.truncate(i % n),
        Mutation::SetByte(i, b) => {
            if let Some(x) = bytes.get_mut(i % n) {
                *x = *b
            }
        }
        Mutation::SetU64(i, v) => {
            let at = i % n;
            let end = (at + 8).min(bytes.len());
            bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        }
        Mutation::SetU32(i, v) => {
            let at = i % n;
            let end = (at + 4).min(bytes.len());
            bytes[at..end].copy_from_slice(&v.to_le_bytes()[..end - at]);
        }
        Mutation::Remove(i, k) => {
            let at = i % n;
            let end = (at + k).min(bytes.len());
            bytes.drain(at..end);
        }
        Mutation::Insert(i, v) => {
            let at = (i % n).min(bytes.len());
            bytes.splice(at..at, v.iter().copied());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random truncations and mutations of a valid file parse to an error or a valid file,
    /// never a panic.
    #[test]
    fn mutated_files_never_panic(mutations in prop::collection::vec(mutation(), 1..6)) {
        let mut bytes = common::sample_writer().to_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if let Ok(gguf) = Gguf::from_bytes(bytes) {
            walk(&gguf);
        }
    }
}
