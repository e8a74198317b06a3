//! `import_jsonl`: arbitrary bytes as a harness JSONL session file.
//!
//! Properties: `read_session` never panics, in plain and strict mode, and
//! allocates only in proportion to the input; a file strict mode accepts,
//! plain mode accepts too; an accepted file written back with
//! `write_session` reads back to the same header, events and surface, with
//! no torn tail.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionlog::adapters::jsonl::{read_session, write_session};
use sessionlog_fuzz::{AllocWindow, budget};

fuzz_target!(|data: &[u8]| {
    let window = AllocWindow::start();
    let plain = read_session(data, false);
    let strict = read_session(data, true);
    if strict.is_ok() {
        assert!(
            plain.is_ok(),
            "strict mode accepted a file plain mode rejects: {:?}",
            plain.err()
        );
    }
    if let Ok(s) = &plain {
        for e in &s.events {
            let _ = e.check_shape();
        }
        let mut out = Vec::new();
        write_session(&mut out, &s.header.header, &s.events).expect("write to a Vec");
        let back = read_session(&out, false)
            .unwrap_or_else(|v| panic!("a file read and written back is rejected: {v}"));
        assert_eq!(back.header.header, s.header.header, "header round trip");
        assert!(back.torn.is_none(), "written file has a torn tail");
        assert!(back.events == s.events, "events round trip");
        assert_eq!(
            back.state.surface(),
            s.state.surface(),
            "surface round trip"
        );
    }
    // Expanded packed rows may legitimately be larger than their row; the
    // JSON text itself is the only source of data.
    window.check(budget(data.len() * 8, 0), "read_session");
});
