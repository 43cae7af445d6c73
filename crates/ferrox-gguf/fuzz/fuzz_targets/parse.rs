#![no_main]
//! Any byte string must parse to an error or to a file whose every accessor works.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = ferrox_gguf::Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    let meta = gguf.metadata();
    for (key, value) in meta.iter() {
        let _ = value.to_owned_value();
        let _ = meta.get_u64(key);
        let _ = meta.get_f32(key);
        let _ = meta.get_str(key);
    }
    for t in gguf.tensors() {
        if let Ok(bytes) = gguf.tensor_data(t) {
            assert_eq!(Some(bytes.len() as u64), t.n_bytes);
        }
    }
});
