//! # loco-real
//!
//! loco's real backend: TCP transport, libtorch trainer, checkpoints, launcher.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod hf;
pub mod memory;
pub mod model;
pub mod prepare;
pub mod sharded;
pub mod train;

pub mod coord;
pub mod exporter;
pub mod http;
pub mod identity;
pub mod inner;
pub mod launch;
pub mod metrics;
pub mod node;
pub mod tcp;
pub mod wan;
pub mod worker_status;

/// Facts about the libtorch this binary was built with, when built with the `torch` feature.
#[cfg(feature = "torch")]
pub mod torch_info {
    use std::sync::OnceLock;

    /// The file of libtorch's CUDA half, found through the binary's rpath or LD_LIBRARY_PATH.
    pub const CUDA_LIBRARY: &str = "libtorch_cuda.so";

    /// Loads libtorch's CUDA library into this process, once; `Err` says why it did not load
    /// (a CPU-only libtorch has none).
    ///
    /// libtorch splits into a CPU and a CUDA library, and registers its CUDA backend when the
    /// latter loads. Nothing in loco calls into it, so the linker leaves it out of the binary's
    /// dependencies, and without this libtorch sees no CUDA device even where there are GPUs.
    /// Loading it only when a CUDA device is asked for also keeps CPU-only processes from
    /// mapping its hundreds of megabytes (about 0.4 s of start-up and 350 MB resident measured
    /// per process when linked in).
    pub fn load_cuda() -> Result<(), String> {
        static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
        LOADED
            .get_or_init(|| {
                use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
                #[allow(unsafe_code)]
                // SAFETY: the library is the CUDA half of the libtorch this binary is linked
                // with (same directory, same build). Its initialisers only register libtorch's
                // CUDA hooks, and it is never unloaded (the handle is leaked below), so no code or
                // data of it can be used after an unload.
                let lib = unsafe { Library::open(Some(CUDA_LIBRARY), RTLD_NOW | RTLD_GLOBAL) };
                lib.map(std::mem::forget).map_err(|e| e.to_string())
            })
            .clone()
    }

    /// A one-line description of libtorch: version of the tch bindings, CUDA availability.
    pub fn describe() -> String {
        let library = match load_cuda() {
            Ok(()) => "loaded".to_owned(),
            Err(e) => format!("not loaded ({e})"),
        };
        format!(
            "tch {} (libtorch {}), cuda library: {library}, cuda available: {}, cuda devices: {}",
            "0.24",
            "2.11.0",
            tch::Cuda::is_available(),
            tch::Cuda::device_count()
        )
    }
}

#[cfg(all(test, feature = "torch"))]
mod tests {
    #[test]
    fn libtorch_matmul_runs() {
        let a = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]);
        let b = a.matmul(&a);
        let v: Vec<f32> = b.reshape([-1]).try_into().unwrap();
        assert_eq!(v, vec![7.0, 10.0, 15.0, 22.0]);
        assert!(super::torch_info::describe().contains("cuda available"));
    }

    /// The CUDA library of this libtorch (a CUDA build from PyPI) loads, and libtorch then has
    /// CUDA kernels: on a machine without a GPU, asking for a CUDA tensor fails for want of a
    /// driver or device, not with "Could not run 'aten::empty.memory_format' with arguments
    /// from the 'CUDA' backend", which is what it says when the library was never loaded.
    #[test]
    fn the_cuda_backend_loads_on_demand() {
        super::torch_info::load_cuda().expect("the PyTorch wheel ships libtorch_cuda.so");
        match tch::Tensor::f_zeros([1], (tch::Kind::Float, tch::Device::Cuda(0))) {
            Ok(t) => assert_eq!(t.device(), tch::Device::Cuda(0), "a GPU is here"),
            Err(e) => {
                let e = e.to_string();
                assert!(!e.contains("from the 'CUDA' backend"), "{e}");
            }
        }
    }
}
