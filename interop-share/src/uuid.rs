//! [`DeviceUuid`] and [`DriverUuid`]: the 16-byte identities an importer
//! compares before it imports (`VkPhysicalDeviceIDProperties`; CUDA's
//! `cuDeviceGetUuid_v2` equals the device one).
//!
//! # Contract
//!
//! * One spelling: [`Display`](fmt::Display) writes the 8-4-4-4-12 lowercase
//!   hex form that `nvidia-smi -L` prints (without its `GPU-` prefix), and
//!   [`FromStr`] reads it back, as well as 32 bare hex digits, either case,
//!   with or without `GPU-`.
//! * A device UUID is not a driver UUID: they are two types.

use std::fmt;
use std::str::FromStr;

/// Why a string is not a UUID.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a UUID: expected 32 hex digits, e.g. 8-4-4-4-12 as nvidia-smi -L prints it \
     (with or without GPU-)"
)]
pub struct ParseUuidError(String);

fn write_uuid(bytes: &[u8; 16], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            f.write_str("-")?;
        }
        write!(f, "{b:02x}")?;
    }
    Ok(())
}

fn parse_uuid(text: &str) -> Result<[u8; 16], ParseUuidError> {
    let bad = || ParseUuidError(text.to_string());
    let body = text.strip_prefix("GPU-").unwrap_or(text);
    let dashed = body.len() == 36;
    if dashed && [8, 13, 18, 23].iter().any(|&i| body.as_bytes()[i] != b'-') {
        return Err(bad());
    }
    let digits: Vec<u8> = body.bytes().filter(|&c| !(dashed && c == b'-')).collect();
    if digits.len() != 32 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
        out[i] = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

macro_rules! uuid_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name([u8; 16]);

        impl $name {
            /// From the 16 bytes the driver reports.
            pub const fn from_bytes(bytes: [u8; 16]) -> Self {
                $name(bytes)
            }
            /// The 16 bytes, as the driver reports them.
            pub const fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl From<[u8; 16]> for $name {
            fn from(bytes: [u8; 16]) -> Self {
                $name(bytes)
            }
        }

        impl From<$name> for [u8; 16] {
            fn from(uuid: $name) -> [u8; 16] {
                uuid.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_uuid(&self.0, f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                write_uuid(&self.0, f)?;
                f.write_str(")")
            }
        }

        impl FromStr for $name {
            type Err = ParseUuidError;
            fn from_str(text: &str) -> Result<Self, ParseUuidError> {
                parse_uuid(text).map($name)
            }
        }
    };
}

uuid_type! {
    /// `VkPhysicalDeviceIDProperties::deviceUUID`, equal to CUDA's
    /// `cuDeviceGetUuid_v2` for the same GPU: how the two APIs find each
    /// other's device.
    ///
    /// ```
    /// use interop_share::uuid::DeviceUuid;
    /// let uuid: DeviceUuid = "GPU-6d657361-3232-2e33-2e36-000000000000".parse()?;
    /// assert_eq!(uuid.to_string(), "6d657361-3232-2e33-2e36-000000000000");
    /// assert_eq!(uuid.as_bytes()[0], 0x6d);
    /// # Ok::<(), interop_share::uuid::ParseUuidError>(())
    /// ```
    DeviceUuid
}

uuid_type! {
    /// `VkPhysicalDeviceIDProperties::driverUUID`: OPAQUE_FD handles work only
    /// between devices whose driver UUIDs match too.
    DriverUuid
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip_and_refuse_what_is_not_a_uuid() {
        let bytes: [u8; 16] = std::array::from_fn(|i| (i as u8) * 17);
        let uuid = DeviceUuid::from_bytes(bytes);
        let text = uuid.to_string();
        assert_eq!(text, "00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(text.parse::<DeviceUuid>().unwrap(), uuid);
        assert_eq!(text.to_uppercase().parse::<DeviceUuid>().unwrap(), uuid);
        assert_eq!(format!("GPU-{text}").parse::<DeviceUuid>().unwrap(), uuid);
        assert_eq!(text.replace('-', "").parse::<DeviceUuid>().unwrap(), uuid);
        assert_eq!(format!("{uuid:?}"), format!("DeviceUuid({text})"));
        for bad in [
            "",
            "0011",
            "00112233-4455-6677-8899-aabbccddeef",
            "00112233-4455-6677-8899-aabbccddeeffa",
            "0011223-34455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeegg",
            "+0112233445566778899aabbccddeeff",
        ] {
            assert!(bad.parse::<DeviceUuid>().is_err(), "{bad:?}");
        }
    }
}
