//! Compiling threads are a bounded resource: eight costly grammars at once are each answered
//! within the timeout (compiled, refused, or busy), and no more than
//! `MAX_CONCURRENT_COMPILES` compile at any moment. A test binary of its own, so that no
//! other test's compilations share the process's slots.

mod common;

use common::{qwen_tokenizer, QWEN_N_VOCAB};
use ferrox_agent::{ConstraintCompiler, GrammarSpec};

/// The names of this process's threads that compile grammars, now.
fn compiling_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.trim() == "ferrox-grammar")
                .count()
        })
        .unwrap_or(0)
}

/// Eight costly compilations at once: each is answered within its timeout (with a slot,
/// or as busy), and no more than two compile at any moment.
#[cfg(target_os = "linux")]
#[test]
fn concurrent_compilations_are_bounded() {
    let mut compiler = ConstraintCompiler::new(qwen_tokenizer(), QWEN_N_VOCAB).unwrap();
    compiler.timeout = std::time::Duration::from_millis(1500);
    let compiler = std::sync::Arc::new(compiler);
    // Many rules, each a large bounded repetition: costly for the lexer.
    let costly: String = (0..400)
        .map(|i| format!("r{i} ::= [a-z]{{0,{}}} [0-9]{{1,{}}}\n", 200 + i, 150 + i))
        .collect::<String>()
        + &format!(
            "root ::= {}\n",
            (0..400)
                .map(|i| format!("r{i}"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(compiling_threads());
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            most
        })
    };
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let compiler = compiler.clone();
            let spec = GrammarSpec::Gbnf(costly.clone());
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let result = compiler.compile(&spec).map(|_| ());
                (result, started.elapsed())
            })
        })
        .collect();
    let results: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
    // Let timed-out compilations finish (their slots are held until then).
    let settle = std::time::Instant::now();
    while compiling_threads() > 0 && settle.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap();
    assert!(
        most <= ferrox_agent::constraint::MAX_CONCURRENT_COMPILES,
        "{most} compiling at once"
    );
    assert!(most >= 1, "the watcher saw no compilation");
    for (result, took) in &results {
        assert!(
            *took < std::time::Duration::from_millis(2500),
            "{took:?}: {result:?}"
        );
    }
    eprintln!("{results:?}");
}
