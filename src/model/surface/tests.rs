//! Tests of the surface index.

use super::*;
use crate::event::{Data, OwnedEvent};

fn ev(
    kind: &str,
    seq: u64,
    data: &str,
    op: Option<SurfaceOp>,
    src: Option<Vec<u64>>,
) -> OwnedEvent {
    let mut e = OwnedEvent::new(kind, seq, 0, data).unwrap();
    e.surface_op = op;
    e.source_event_seqs = src;
    e
}

fn user(seq: u64) -> OwnedEvent {
    ev("user/message", seq, "{}", Some(SurfaceOp::Append), None)
}

fn replace(seq: u64, start: u64, end: u64, src: Vec<u64>) -> OwnedEvent {
    ev(
        "user/message",
        seq,
        "{}",
        Some(SurfaceOp::Replace { start, end }),
        Some(src),
    )
}

fn build(events: &[OwnedEvent]) -> Result<Surface, Violation> {
    let log = events.to_vec();
    let mut s = Surface::new();
    for e in events {
        s.fold(e, &log)?;
    }
    Ok(s)
}

#[test]
fn append_and_replace_in_place() {
    let log = vec![
        user(0),
        user(1),
        user(2),
        user(3),
        replace(4, 1, 2, vec![1, 2]),
    ];
    let s = build(&log).unwrap();
    assert_eq!(s.seqs(), vec![0, 4, 3]);
    assert_eq!(s.replace_generation(), 1);
    assert_eq!(s.replacements()[0].shadowed_seqs, vec![1, 2]);
    assert_eq!(s.last_processed_seq(), Some(4));
    // Label order follows list order after a replace.
    let mut log2 = log.clone();
    log2.push(replace(5, 4, 3, vec![4, 3]));
    assert_eq!(build(&log2).unwrap().seqs(), vec![0, 5]);
    let mut log3 = log;
    log3.push(replace(5, 3, 4, vec![4, 3]));
    assert_eq!(build(&log3).unwrap_err().rule, Rule::ReplaceRange);
}

#[test]
fn replace_endpoints_must_be_on_surface() {
    let log = vec![
        user(0),
        user(1),
        replace(2, 0, 0, vec![0]),
        replace(3, 0, 1, vec![0, 1]),
    ];
    let v = build(&log).unwrap_err();
    assert_eq!((v.rule, v.seq()), (Rule::ReplaceRange, Some(3)));
    let log = vec![user(0), replace(1, 0, 7, vec![0])];
    assert_eq!(build(&log).unwrap_err().rule, Rule::ReplaceRange);
    let log = vec![user(0), user(1), replace(2, 1, 0, vec![0, 1])];
    assert_eq!(build(&log).unwrap_err().rule, Rule::ReplaceRange);
}

#[test]
fn provenance_rules() {
    let tr = |seq, src| ev("tool/result", seq, "{}", Some(SurfaceOp::Append), Some(src));
    assert_eq!(
        build(&[user(0), tr(1, vec![])]).unwrap_err().rule,
        Rule::Provenance
    );
    assert_eq!(
        build(&[user(0), tr(1, vec![1])]).unwrap_err().rule,
        Rule::Provenance
    );
    assert_eq!(
        build(&[user(0), user(1), tr(2, vec![1, 0, 1])])
            .unwrap_err()
            .rule,
        Rule::Provenance
    );
    assert!(build(&[user(0), user(1), tr(2, vec![1, 0])]).is_ok());
    let am = ev(
        "assistant/message",
        0,
        "{}",
        Some(SurfaceOp::Append),
        Some(vec![]),
    );
    assert!(build(&[am]).is_ok());
}

#[test]
fn replace_sources_must_cover() {
    let log = vec![user(0), user(1), replace(2, 0, 1, vec![0])];
    assert_eq!(build(&log).unwrap_err().rule, Rule::ReplaceSources);
    let mut r = replace(2, 0, 0, vec![0]);
    r.source_event_seqs = None;
    assert_eq!(
        build(&[user(0), user(1), r]).unwrap_err().rule,
        Rule::ReplaceSources
    );
}

#[test]
fn tool_result_rewrite_rule() {
    let nested = |text: &str| {
        format!(
            r#"{{"turn":1,"step":1,"message":{{"role":"user","source":{{"kind":"tool","callId":"c"}},"content":[{{"type":"tool-result","toolCallId":"c","content":[{{"type":"text","text":"{text}"}}],"isError":false}}]}}}}"#
        )
    };
    let tr = |seq, data: &str, op| ev("tool/result", seq, data, Some(op), Some(vec![0]));
    let rep = SurfaceOp::Replace { start: 1, end: 1 };
    let ok = vec![
        user(0),
        tr(1, &nested("long"), SurfaceOp::Append),
        tr(2, &nested("short"), rep),
    ];
    let mut ok = ok;
    ok[2].source_event_seqs = Some(vec![1]);
    assert_eq!(build(&ok).unwrap().seqs(), vec![0, 2]);

    let mut bad = ok.clone();
    bad[2].data =
        Data::from_json(nested("short").replace("\"isError\":false", "\"isError\":true")).unwrap();
    assert_eq!(build(&bad).unwrap_err().rule, Rule::ToolResultRewrite);

    let flat = r#"{"turn":1,"step":1,"callId":"c","content":[],"isError":false}"#;
    let mut dialect = ok.clone();
    dialect[2].data = Data::from_json(flat).unwrap();
    assert_eq!(build(&dialect).unwrap_err().rule, Rule::ToolResultRewrite);

    // Flat rewrites compare everything but `content`.
    let flat2 = r#"{"turn":1,"step":1,"callId":"c","content":[{"type":"text","text":"x"}],"isError":false}"#;
    let log = vec![
        user(0),
        tr(1, flat2, SurfaceOp::Append),
        ev("tool/result", 2, flat, Some(rep), Some(vec![1])),
    ];
    assert!(build(&log).is_ok());

    // A tool/result cannot replace a user message, nor two nodes.
    let log = vec![
        user(0),
        ev(
            "tool/result",
            1,
            flat,
            Some(SurfaceOp::Replace { start: 0, end: 0 }),
            Some(vec![0]),
        ),
    ];
    assert_eq!(build(&log).unwrap_err().rule, Rule::ToolResultRewrite);
    let log = vec![
        user(0),
        user(1),
        ev(
            "tool/result",
            2,
            flat,
            Some(SurfaceOp::Replace { start: 0, end: 1 }),
            Some(vec![0, 1]),
        ),
    ];
    assert_eq!(build(&log).unwrap_err().rule, Rule::ToolResultRewrite);
}

#[test]
fn undo_restores_exactly() {
    let log = vec![
        user(0),
        user(1),
        user(2),
        replace(3, 0, 1, vec![0, 1]),
        user(4),
    ];
    let mut s = Surface::new();
    let mut undos = vec![];
    let mut states = vec![s.clone()];
    for e in &log {
        let plan = s.check(e, &log).unwrap();
        undos.push(s.apply(e, plan));
        states.push(s.clone());
    }
    while let Some(u) = undos.pop() {
        s.undo(u);
        states.pop();
        assert_eq!(&s, states.last().unwrap());
        assert_eq!(s.next_label, states.last().unwrap().next_label);
    }
}

#[test]
fn live_in_is_contains_over_the_range() {
    let other = ev("tool/call", 1, "{}", None, None);
    let log = vec![
        user(0),
        other,
        user(2),
        user(3),
        replace(4, 2, 3, vec![2, 3]),
        user(5),
    ];
    let s = build(&log).unwrap();
    assert_eq!(s.seqs(), vec![0, 4, 5]);
    for a in 0..8 {
        for b in a..8 {
            let want: Vec<u64> = (a..b).filter(|&q| s.contains(q)).collect();
            assert_eq!(s.live_in(a..b).collect::<Vec<_>>(), want, "{a}..{b}");
        }
    }
}
