//! The element types and reduction operators, in one place: their numbering (that of the C
//! enums `mcast_dtype_t` and `mcast_op_t`, which [`crate::capi`] converts with
//! [`DType::from_raw`] and [`RedOp::from_raw`]), sizes, short names and the names NCCL and
//! nccl-tests use for them ([`DType::parse`], [`RedOp::parse`]). The kernels, the C boundary and
//! `mcast-bench` all use these; a new dtype starts here.

/// Element types, numbered as `mcast_dtype_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `float`.
    F32 = 0,
    /// `double`.
    F64 = 1,
    /// IEEE half.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// `int32_t`.
    I32 = 4,
    /// `uint32_t`.
    U32 = 5,
    /// `int64_t`.
    I64 = 6,
    /// `uint64_t`.
    U64 = 7,
}

impl DType {
    /// Every dtype, in `mcast_dtype_t` order.
    pub const ALL: [DType; 8] =
        [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::U32, DType::I64, DType::U64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Short name used in kernel names, messages and mcast-bench's table (`"bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
        }
    }

    /// The other names it goes by: nccl-tests' `-d` names (`float`, `bfloat16`, ...) and the
    /// `ncclDataType_t` names without the prefix (`float32`, ...).
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            DType::F32 => &["float", "float32"],
            DType::F64 => &["double", "float64"],
            DType::F16 => &["half", "float16"],
            DType::BF16 => &["bfloat16"],
            DType::I32 => &["int", "int32"],
            DType::U32 => &["uint32"],
            DType::I64 => &["int64"],
            DType::U64 => &["uint64"],
        }
    }

    /// The dtype named `name` ([`DType::name`] or one of its [`DType::aliases`]), any case.
    pub fn parse(name: &str) -> Option<DType> {
        let name = name.to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| d.name() == name || d.aliases().contains(&name.as_str()))
    }

    /// From the `mcast_dtype_t` integer.
    pub fn from_raw(raw: u32) -> Option<DType> {
        DType::ALL.get(raw as usize).copied()
    }
}

/// Reduction operators, numbered as `mcast_op_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// Sum.
    Sum = 0,
    /// Minimum.
    Min = 1,
    /// Maximum.
    Max = 2,
}

impl RedOp {
    /// Every operator, in `mcast_op_t` order.
    pub const ALL: [RedOp; 3] = [RedOp::Sum, RedOp::Min, RedOp::Max];

    /// Short name used in kernel names, messages and mcast-bench's table (`"sum"`), which is
    /// also nccl-tests' `-o` name.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }

    /// The operator named `name` ([`RedOp::name`]), any case.
    pub fn parse(name: &str) -> Option<RedOp> {
        let name = name.to_ascii_lowercase();
        RedOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// From the `mcast_op_t` integer.
    pub fn from_raw(raw: u32) -> Option<RedOp> {
        RedOp::ALL.get(raw as usize).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::collective::{McastDtype, McastOp};

    #[test]
    fn the_numbering_is_the_c_enums() {
        let c = [
            McastDtype::MCAST_FLOAT32,
            McastDtype::MCAST_FLOAT64,
            McastDtype::MCAST_FLOAT16,
            McastDtype::MCAST_BFLOAT16,
            McastDtype::MCAST_INT32,
            McastDtype::MCAST_UINT32,
            McastDtype::MCAST_INT64,
            McastDtype::MCAST_UINT64,
        ];
        for (d, c) in DType::ALL.iter().zip(c) {
            assert_eq!(*d as u32, c as u32, "{d:?}");
            assert_eq!(DType::from_raw(c as u32), Some(*d));
        }
        for (o, c) in RedOp::ALL.iter().zip([McastOp::MCAST_SUM, McastOp::MCAST_MIN, McastOp::MCAST_MAX]) {
            assert_eq!(*o as u32, c as u32, "{o:?}");
            assert_eq!(RedOp::from_raw(c as u32), Some(*o));
        }
        assert_eq!((DType::from_raw(8), RedOp::from_raw(3)), (None, None));
    }

    #[test]
    fn names_and_aliases_parse_to_one_dtype() {
        let mut seen = std::collections::HashSet::new();
        for d in DType::ALL {
            for n in std::iter::once(d.name()).chain(d.aliases().iter().copied()) {
                assert!(seen.insert(n), "{n} names two dtypes");
                assert_eq!(DType::parse(n), Some(d));
                assert_eq!(DType::parse(&n.to_uppercase()), Some(d));
            }
        }
        assert_eq!((DType::parse("f8"), DType::parse("")), (None, None));
        assert_eq!((RedOp::parse("MAX"), RedOp::parse("prod")), (Some(RedOp::Max), None));
    }
}
