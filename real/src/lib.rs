//! # loco-real
//!
//! loco's real backend: TCP transport, libtorch trainer, checkpoints, launcher. (Being built: issue 6.)
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod memory;
pub mod model;
pub mod train;

pub mod coord;
pub mod inner;
pub mod node;
pub mod tcp;

/// Facts about the libtorch this binary was built with, when built with the `torch` feature.
#[cfg(feature = "torch")]
pub mod torch_info {
    /// A one-line description of libtorch: version of the tch bindings, CUDA availability.
    pub fn describe() -> String {
        format!(
            "tch {} (libtorch {}), cuda available: {}, cuda devices: {}",
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
}
