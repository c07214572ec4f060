//! With the `torch` feature, records libtorch's library directory as an rpath of the `loco`
//! binary, so that it runs without LD_LIBRARY_PATH (scripts/torch-env.sh exports LIBTORCH).

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    if let Ok(libtorch) = std::env::var("LIBTORCH") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{libtorch}/lib");
    }
}
