//! Compact encoding of big numeric arrays inside JSON records.
//!
//! Log-probs and MoE routing are the bulk of a trajectory. As JSON number arrays they would be
//! 5-10× larger and slow to parse, so they are stored as `{"dtype", "shape", "data"}` where
//! `data` is the little-endian packed array, base64 (standard alphabet, padded). zstd compresses
//! the rest. Python: `np.frombuffer(base64.b64decode(x["data"]), dtype="<f4").reshape(x["shape"])`.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// Element type of a [`Packed`] array; names follow numpy (`f32` = `<f4`, `u8`, `u16` = `<u2`, ...).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F32,
    U8,
    U16,
    I32,
    U32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
        }
    }
}

/// Why a packed array could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PackedError {
    #[error("data is not valid base64: {0}")]
    Base64(String),
    #[error("shape {shape:?} of {dtype:?} needs {want} bytes, data has {got}")]
    Length {
        dtype: DType,
        shape: Vec<usize>,
        want: usize,
        got: usize,
    },
    #[error("expected dtype {want}, found {got:?}")]
    DType { want: &'static str, got: DType },
}

/// A little-endian packed numeric array with its shape and dtype, base64 in JSON.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Packed {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: String,
}

impl Default for Packed {
    /// An empty 1-d f32 array.
    fn default() -> Self {
        Packed {
            dtype: DType::F32,
            shape: vec![0],
            data: String::new(),
        }
    }
}

impl Packed {
    fn from_bytes(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Self {
        debug_assert_eq!(bytes.len(), shape.iter().product::<usize>() * dtype.size());
        Packed {
            dtype,
            shape,
            data: B64.encode(bytes),
        }
    }

    /// Number of elements the shape describes.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True when the shape has zero elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decoded raw bytes, checked against shape and dtype.
    pub fn bytes(&self) -> Result<Vec<u8>, PackedError> {
        let bytes = B64
            .decode(self.data.as_bytes())
            .map_err(|e| PackedError::Base64(e.to_string()))?;
        let want = self.len() * self.dtype.size();
        if bytes.len() != want {
            return Err(PackedError::Length {
                dtype: self.dtype,
                shape: self.shape.clone(),
                want,
                got: bytes.len(),
            });
        }
        Ok(bytes)
    }

    /// Packs f32 values (e.g. per-token log-probs) with the given shape.
    pub fn from_f32(shape: Vec<usize>, values: &[f32]) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            values.len(),
            "invariant: shape matches values"
        );
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(DType::F32, shape, &bytes)
    }

    /// A 1-d f32 array.
    pub fn f32_vec(values: &[f32]) -> Self {
        Self::from_f32(vec![values.len()], values)
    }

    /// Decodes an f32 array.
    pub fn to_f32(&self) -> Result<Vec<f32>, PackedError> {
        if self.dtype != DType::F32 {
            return Err(PackedError::DType {
                want: "f32",
                got: self.dtype,
            });
        }
        Ok(self
            .bytes()?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Packs expert ids (`[tokens, layers, top_k]`) as u8 when every id fits, else u16.
    pub fn from_experts(shape: Vec<usize>, ids: &[u16]) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            ids.len(),
            "invariant: shape matches ids"
        );
        if ids.iter().all(|&e| e <= u8::MAX as u16) {
            let bytes: Vec<u8> = ids.iter().map(|&e| e as u8).collect();
            Self::from_bytes(DType::U8, shape, &bytes)
        } else {
            let bytes: Vec<u8> = ids.iter().flat_map(|e| e.to_le_bytes()).collect();
            Self::from_bytes(DType::U16, shape, &bytes)
        }
    }

    /// Decodes an integer array (u8, u16, u32 or non-negative i32) as u32 values.
    pub fn to_u32(&self) -> Result<Vec<u32>, PackedError> {
        let bytes = self.bytes()?;
        Ok(match self.dtype {
            DType::U8 => bytes.iter().map(|&b| b as u32).collect(),
            DType::U16 => bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
                .collect(),
            DType::U32 => bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::I32 => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]).max(0) as u32)
                .collect(),
            DType::F32 => {
                return Err(PackedError::DType {
                    want: "integer",
                    got: DType::F32,
                })
            }
        })
    }

    /// Decodes expert ids as u16 (the widest expert id the format stores).
    pub fn to_experts(&self) -> Result<Vec<u16>, PackedError> {
        Ok(self
            .to_u32()?
            .into_iter()
            .map(|v| v.min(u16::MAX as u32) as u16)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_round_trip_is_bit_exact() {
        let v = [-0.0f32, 1.5, f32::MIN_POSITIVE, -123.456, f32::NEG_INFINITY];
        let p = Packed::f32_vec(&v);
        let json = serde_json::to_string(&p).unwrap();
        let back: Packed = serde_json::from_str(&json).unwrap();
        let got = back.to_f32().unwrap();
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn experts_pick_the_narrowest_dtype() {
        let small = Packed::from_experts(vec![2, 1, 2], &[0, 7, 3, 255]);
        assert_eq!(small.dtype, DType::U8);
        assert_eq!(small.to_experts().unwrap(), vec![0, 7, 3, 255]);
        let wide = Packed::from_experts(vec![1, 1, 2], &[256, 511]);
        assert_eq!(wide.dtype, DType::U16);
        assert_eq!(wide.to_experts().unwrap(), vec![256, 511]);
    }

    #[test]
    fn length_mismatch_is_reported() {
        let mut p = Packed::f32_vec(&[1.0, 2.0]);
        p.shape = vec![3];
        assert_eq!(
            p.to_f32().unwrap_err(),
            PackedError::Length {
                dtype: DType::F32,
                shape: vec![3],
                want: 12,
                got: 8
            }
        );
    }
}
