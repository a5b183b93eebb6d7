//! The extension links the librdkafka that confluent-kafka's wheel ships
//! (`packaging/link_librdkafka.py` writes what the rdkafka crate's build finds it by); at run
//! time the loader finds that file beside the extension's package, in the `site-packages`
//! both are installed into.
fn main() {
    println!("cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN/../confluent_kafka.libs");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    // The script writes the file again at every build, so the extension is linked again: the
    // library's name (its soname, with the wheel's hash) may have changed with confluent-kafka.
    if let Ok(dirs) = std::env::var("PKG_CONFIG_PATH") {
        for dir in std::env::split_paths(&dirs) {
            println!("cargo:rerun-if-changed={}", dir.join("rdkafka.pc").display());
        }
    }
}
