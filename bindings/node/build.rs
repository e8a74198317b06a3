//! Emits the linker arguments a Node addon needs (napi symbols are resolved
//! by the host process at load time, not at link time).
fn main() {
    napi_build::setup();
}
