//! Key tables: a struct of checked values (`Config`, `AdminConfig`, `StateConfig`, ...) declared
//! as rows, one a key, each naming the setting it is read from, the kind of value, its default and
//! its checks. `key_table!` makes both directions from the rows: the values from a layer of
//! settings (`Keys::read`) and the effective settings back from them (`Keys::write`), so each
//! default is written once and the two directions cannot drift apart.
//!
//! A row is `setting [=> field]: Kind [= default] [, unless |v| bad => why]* ;`
//! - `setting`: the field of the settings struct; its key is the name with `-` for `_`, behind the
//!   table's prefix (`keys "state."`). `field`: the struct's own, when its name differs.
//! - `Kind`: how the setting becomes the value and is printed back (a `Kind` below).
//! - `default`: the value in force when no layer sets the key. A row without one is an `Option`,
//!   unset unless set.
//! - each `unless` refuses a value (the default too) for which `bad` holds, saying `why`.
//!
//! Keys with logic of their own, or several settings behind one field, are `groups`: a type that
//! implements `Keys` (both directions in one impl), and the settings it reads.

use std::borrow::Cow;
use std::time::Duration;

use super::admin::Uids;
use super::values::{ByteSize, Dur, SocketMode};
use super::ConfigError;

/// Values read from a struct of settings `S`, checked, and written back as the effective settings.
pub(crate) trait Keys<S> {
    type Value;
    /// The values of `s`: its keys, the defaults where it sets none, checked.
    fn read(s: &S) -> Result<Self::Value, ConfigError>;
    /// Sets `s`'s keys to what is in force in `v`.
    fn write(v: &Self::Value, s: &mut S);
}

/// How one key's setting `S` becomes its value `V`, and is printed back.
pub(crate) trait Kind<S, V> {
    fn value(s: S) -> Result<V, String>;
    /// `None`: printed as unset.
    fn setting(v: &V) -> Option<S>;
}

/// The value is the setting.
pub(crate) struct Plain;

impl<T: Clone> Kind<T, T> for Plain {
    fn value(s: T) -> Result<T, String> {
        Ok(s)
    }
    fn setting(v: &T) -> Option<T> {
        Some(v.clone())
    }
}

/// Kinds whose setting is a newtype around the value.
macro_rules! wrapped {
    ($($(#[$doc:meta])* $kind:ident: $setting:ident($value:ty);)*) => {$(
        $(#[$doc])*
        pub(crate) struct $kind;

        impl Kind<$setting, $value> for $kind {
            fn value(s: $setting) -> Result<$value, String> {
                Ok(s.0)
            }
            fn setting(v: &$value) -> Option<$setting> {
                Some($setting(*v))
            }
        }
    )*};
}

wrapped! {
    /// A duration, zero included.
    Time: Dur(Duration);
    /// A size in bytes.
    Bytes: ByteSize(usize);
    /// An octal file mode.
    Mode: SocketMode(u32);
}

/// A duration longer than zero.
pub(crate) struct Positive;

impl Kind<Dur, Duration> for Positive {
    fn value(s: Dur) -> Result<Duration, String> {
        match s.0.is_zero() {
            true => Err("must be longer than zero".into()),
            false => Ok(s.0),
        }
    }
    fn setting(v: &Duration) -> Option<Dur> {
        Some(Dur(*v))
    }
}

/// A duration where `0s` turns the thing off (`None`).
pub(crate) struct ZeroOff;

impl Kind<Dur, Option<Duration>> for ZeroOff {
    fn value(s: Dur) -> Result<Option<Duration>, String> {
        Ok((!s.0.is_zero()).then_some(s.0))
    }
    fn setting(v: &Option<Duration>) -> Option<Dur> {
        Some(Dur(v.unwrap_or(Duration::ZERO)))
    }
}

/// A list of uids; empty is printed as unset.
pub(crate) struct UidList;

impl Kind<Uids, Vec<u32>> for UidList {
    fn value(s: Uids) -> Result<Vec<u32>, String> {
        Ok(s.0)
    }
    fn setting(v: &Vec<u32>) -> Option<Uids> {
        (!v.is_empty()).then(|| Uids(v.clone()))
    }
}

/// A field that is no setting (`Config::launch`): unset when read, never printed.
pub(crate) struct NotASetting<T>(std::marker::PhantomData<T>);

impl<S, T> Keys<S> for NotASetting<T> {
    type Value = Option<T>;
    fn read(_: &S) -> Result<Option<T>, ConfigError> {
        Ok(None)
    }
    fn write(_: &Option<T>, _: &mut S) {}
}

/// A row's value: its setting's, or `default` when unset; an error names the row's key.
pub(crate) fn or_default<K: Kind<S, V>, S, V>(
    key: &dyn Fn() -> Cow<'static, str>,
    setting: Option<S>,
    default: V,
) -> Result<V, ConfigError> {
    Ok(optional::<K, S, V>(key, setting)?.unwrap_or(default))
}

/// The value of a row without a default: unset unless set.
pub(crate) fn optional<K: Kind<S, V>, S, V>(
    key: &dyn Fn() -> Cow<'static, str>,
    setting: Option<S>,
) -> Result<Option<V>, ConfigError> {
    let value = setting.map(K::value).transpose();
    value.map_err(|why| super::invalid(key(), why))
}

/// The key of a settings field, for errors: `state.` and `lease_idle` is `state.lease-idle`.
pub(crate) fn key_name(prefix: &str, field: &str) -> Cow<'static, str> {
    Cow::Owned(format!("{prefix}{}", field.replace('_', "-")))
}

pub(crate) const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub(crate) const fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Declares a key table (see the module's documentation):
///
/// ```text
/// key_table! {
///     Config from Settings, every key {  // each field of Settings is in a row or a group
///         slots: Plain = Slots::Auto, unless |s| *s == Slots::Fixed(0) => "must be at least 1";
///         ...
///     }
///     groups {
///         admin: AdminConfig [admin_token_file, ...];
///     }
/// }
/// ```
macro_rules! key_table {
    (
        $config:ident from $settings:ident $(, keys $prefix:literal)? $(, every $every:ident)? {
            $($rows:tt)*
        }
        $(groups { $($groups:tt)* })?
    ) => {
        key_table!(@rows [$config $settings ("" $(, $prefix)?) ($($every)?) ($($($groups)*)?)] []
            $($rows)*);
    };
    // Every row read: the impl.
    (@rows [$config:ident $settings:ident ($($prefix:literal),*) ($($every:ident)?)
        ($($gfield:ident : $group:ty [$($gset:ident),*];)*)]
        [$({$set:ident $field:ident $kind:ident ($($default:expr)?)
            ($(|$v:ident| $bad:expr => $why:expr),*)})*]
    ) => {
        impl $crate::config::table::Keys<$settings> for $config {
            type Value = $config;
            fn read(s: &$settings) -> Result<$config, $crate::config::ConfigError> {
                key_table!(@every ($($every)?) $settings s [$($set)* $($($gset)*)*]);
                const PREFIX: &str = concat!($($prefix),*);
                Ok($config {
                    $($gfield: <$group as $crate::config::table::Keys<$settings>>::read(s)?,)*
                    $($field: {
                        let key = || $crate::config::table::key_name(PREFIX, stringify!($set));
                        let v = key_table!(@value key, s.$set.clone(), $kind $(, $default)?);
                        $({
                            let $v = &v;
                            if $bad {
                                return Err($crate::config::invalid(key(), $why));
                            }
                        })*
                        v
                    },)*
                })
            }
            fn write(c: &$config, s: &mut $settings) {
                $(s.$set = key_table!(@setting &c.$field, $kind $(, $default)?);)*
                $(<$group as $crate::config::table::Keys<$settings>>::write(&c.$gfield, s);)*
            }
        }
    };
    // One row, its field named.
    (@rows $head:tt [$($done:tt)*] $set:ident => $field:ident : $($rest:tt)*) => {
        key_table!(@row $head [$($done)*] $set $field $($rest)*);
    };
    (@rows $head:tt [$($done:tt)*] $set:ident : $($rest:tt)*) => {
        key_table!(@row $head [$($done)*] $set $set $($rest)*);
    };
    (@row $head:tt [$($done:tt)*] $set:ident $field:ident $kind:ident $(= $default:expr)?
        $(, unless |$v:ident| $bad:expr => $why:expr)* ; $($rest:tt)*
    ) => {
        key_table!(@rows $head
            [$($done)* {$set $field $kind ($($default)?) ($(|$v| $bad => $why),*)}] $($rest)*);
    };
    (@value $key:ident, $setting:expr, $kind:ident) => {
        $crate::config::table::optional::<$kind, _, _>(&$key, $setting)?
    };
    (@value $key:ident, $setting:expr, $kind:ident, $default:expr) => {
        $crate::config::table::or_default::<$kind, _, _>(&$key, $setting, $default)?
    };
    (@setting $v:expr, $kind:ident) => {
        $v.as_ref().and_then(<$kind as $crate::config::table::Kind<_, _>>::setting)
    };
    (@setting $v:expr, $kind:ident, $default:expr) => {
        <$kind as $crate::config::table::Kind<_, _>>::setting($v)
    };
    // With `every`, a settings field in no row nor group does not compile.
    (@every () $($rest:tt)*) => {};
    (@every ($key:ident) $settings:ident $s:ident [$($f:ident)*]) => {
        let $settings { $($f: _),* } = $s;
    };
}
