//! The typed event builders make events that fold through every rule of
//! the model, escape what they are given, and round-trip through the
//! store; events and derived messages serialise with serde as their JSON.

use sessionlog::build::{self, ToolCall};
use sessionlog::derive;
use sessionlog::event::{Event, OwnedEvent};
use sessionlog::header::SessionHeader;
use sessionlog::session::SessionState;
use sessionlog::store::{Options, Store};

fn turn(hostile: &str) -> Vec<OwnedEvent> {
    let call = ToolCall {
        id: "c1",
        name: "bash",
        arguments: r#"{"command":"echo \"hi\""}"#,
    };
    vec![
        build::turn_start(0, 1, 1),
        build::user_message(1, 1, hostile),
        build::step_start(2, 2, 1, 1),
        build::text_chunk(3, 2, 1, 1, hostile),
        build::assistant_message(4, 3, 1, 1, hostile, &[call], &[3]),
        build::tool_call(5, 3, 1, 1, &call),
        build::tool_result(6, 4, 1, 1, "c1", 5, hostile, true),
        build::step_end(7, 4, 1, 1),
        build::turn_end(8, 4, 1),
    ]
}

#[test]
fn a_built_turn_folds_derives_and_round_trips() {
    let hostile = "quote \" backslash \\ newline \n tab \t nul \u{0} é 😀";
    let events = turn(hostile);
    let mut state = SessionState::new(false);
    state
        .append_batch(&events, &Vec::<Event<'_>>::new())
        .expect("every rule holds");
    assert!(state.closers().is_empty(), "the turn is closed");
    let messages = derive::derive(state.surface(), &events).unwrap();
    assert_eq!(messages.len(), 3, "user, assistant, tool result");
    // The strings come back exactly.
    let user: serde_json::Value = serde_json::from_str(&messages[0].to_json()).unwrap();
    assert_eq!(user["content"][0]["text"], hostile);
    let assistant: serde_json::Value = serde_json::from_str(&messages[1].to_json()).unwrap();
    assert_eq!(
        assistant["content"][1]["arguments"],
        r#"{"command":"echo \"hi\""}"#
    );
    // Serialize: the same JSON as to_json, for events and messages.
    for e in &events {
        assert_eq!(serde_json::to_string(e).unwrap(), e.to_json());
    }
    assert_eq!(
        serde_json::to_string(&messages[2]).unwrap(),
        messages[2].to_json()
    );
    // And the store takes them.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    store.create(SessionHeader::new("s", 0)).unwrap();
    store.append("s", &events).unwrap();
    assert_eq!(store.load("s").unwrap().1, events);
}

#[test]
fn a_turn_cut_short_needs_the_harness_closers() {
    let events = turn("x");
    let mut state = SessionState::new(false);
    // Crashed after the tool call: result, step end and turn end missing.
    state
        .append_batch(&events[..6], &Vec::<Event<'_>>::new())
        .unwrap();
    let kinds: Vec<String> = state.closers().iter().map(|e| e.kind.to_string()).collect();
    assert_eq!(kinds, ["tool/result", "step/end", "turn/end"]);
}
