use ferrox_gguf::{split_path, GgmlType, Gguf, GgufError, GgufWriter};

/// Writes `count` shards holding tensors t0..t5 spread over them, as gguf-split does.
fn write_split(dir: &std::path::Path, count: u32, tensors_count_key: u64) -> String {
    let prefix = dir.join("model").to_str().unwrap().to_string();
    for no in 0..count {
        let mut w = GgufWriter::new();
        if no == 0 {
            w.set("general.architecture", "llama")
                .set("split.tensors.count", tensors_count_key);
        }
        w.set("split.no", no as u16)
            .set("split.count", count as u16);
        for t in (0..6).filter(|t| t % count == no) {
            let data: Vec<u8> = (0..8)
                .flat_map(|i| ((t * 10 + i) as f32).to_le_bytes())
                .collect();
            w.add_tensor(format!("t{t}"), GgmlType::F32, &[8], data)
                .unwrap();
        }
        w.write_file(split_path(&prefix, no, count)).unwrap();
    }
    split_path(&prefix, 0, count)
}

#[test]
fn split_checkpoints_open_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(dir.path(), 3, 6);
    let gguf = Gguf::open(&first).unwrap();
    assert_eq!(gguf.shard_count(), 3);
    assert_eq!(gguf.tensors().len(), 6);
    assert_eq!(gguf.metadata().architecture().unwrap(), "llama");
    for t in 0..6u32 {
        let info = gguf.require_tensor(&format!("t{t}")).unwrap();
        assert_eq!(info.shard as u32, t % 3);
        let data = gguf.tensor_data(info).unwrap();
        assert_eq!(
            f32::from_le_bytes(data[4..8].try_into().unwrap()),
            (t * 10 + 1) as f32
        );
    }
}

#[test]
fn split_inconsistencies_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_split(dir.path(), 2, 7);
    let e = Gguf::open(&first).err().unwrap();
    assert!(e.to_string().contains("split.tensors.count"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let first = write_split(dir.path(), 3, 6);
    let second = first.replace("00001-of", "00002-of");
    assert!(Gguf::open(&second)
        .err()
        .unwrap()
        .to_string()
        .contains("open the first"));
    std::fs::remove_file(first.replace("00001-of", "00003-of")).unwrap();
    assert!(matches!(Gguf::open(&first), Err(GgufError::Io { .. })));
}
