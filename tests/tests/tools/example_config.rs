//! `examples/slotgate.toml`, the annotated configuration the README points to: `slotgate check`
//! accepts it, and it names every key the configuration file accepts (set, or commented out with
//! its default), so a new key cannot be left out of it. The keys come from the code: the field
//! names serde's derive gives `Settings` and each table below it, read with a probing deserializer.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::de::value::Error;
use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde::forward_to_deserialize_any;
use slotgate::config::Settings;
use slotgate_tests::gate::command;

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/slotgate.toml")
}

#[test]
fn the_example_config_passes_check() {
    let out = command()
        .arg("check")
        .arg("--config")
        .arg(example())
        .output()
        .expect("run slotgate check");
    assert!(
        out.status.success(),
        "slotgate check --config examples/slotgate.toml failed with {}:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_example_config_names_every_key() {
    let accepted = file_keys::<Settings>();
    let text = std::fs::read_to_string(example()).unwrap();
    let named = named_keys(&text);
    let missing: Vec<_> = accepted.difference(&named).collect();
    let unknown: Vec<_> = named.difference(&accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "examples/slotgate.toml must name every key the file accepts (commented out with its \
         default will do), and only those:\nkeys it lacks: {missing:?}\nkeys it names that do not \
         exist: {unknown:?}"
    );
}

#[test]
fn the_key_probe_sees_nested_tables_and_commented_keys() {
    let keys = file_keys::<Settings>();
    for key in [
        "queue-depth",
        "state",
        "state.lease-idle",
        "models.slots",
        "policy.path",
    ] {
        assert!(keys.contains(key), "{key} in {keys:?}");
    }
    let named = named_keys(
        "a = 1\n# b = \"2s\"\n# Prose, not = a key.\n[cost]\nc = 3\n# [models.\"m.1\"]\n# d = 4\n\
         [[policy]]\n# e = \"x\"\n",
    );
    let want = [
        "a", "b", "cost", "cost.c", "models", "models.d", "policy", "policy.e",
    ];
    assert_eq!(named, want.map(str::to_owned).into());
}

/// The keys a TOML file of `T` accepts, a nested table's as `table.key`: what serde's derive asks
/// for, found by a probe that walks one path of fields per run.
fn file_keys<T: de::DeserializeOwned>() -> BTreeSet<String> {
    let mut found: BTreeMap<Vec<&'static str>, &'static [&'static str]> = BTreeMap::new();
    let mut todo = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let mut fields = None;
        let _ = T::deserialize(Probe {
            path: &path,
            fields: &mut fields,
        });
        if let Some(fields) = fields {
            for f in fields {
                let mut deeper = path.clone();
                deeper.push(*f);
                todo.push(deeper);
            }
            found.insert(path, fields);
        }
    }
    let mut keys = BTreeSet::new();
    for (path, fields) in found {
        for f in fields {
            let mut key: Vec<&str> = path.clone();
            key.push(f);
            keys.insert(key.join("."));
        }
    }
    keys
}

/// Walks `path` through the structs it meets (a map or a list passes its one value on); at its
/// end, records the fields of the struct found there. Every run ends in an error, on purpose.
struct Probe<'p> {
    path: &'p [&'static str],
    fields: &'p mut Option<&'static [&'static str]>,
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("a value, not a table"))
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_map(One {
            key: Some("NAME"),
            value: Some(self),
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_seq(One {
            key: None,
            value: Some(self),
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        let Some((first, rest)) = self.path.split_first() else {
            *self.fields = Some(fields);
            return Err(de::Error::custom("found"));
        };
        v.visit_map(One {
            key: Some(*first),
            value: Some(Probe {
                path: rest,
                fields: self.fields,
            }),
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit
        unit_struct tuple tuple_struct enum identifier ignored_any
    }
}

/// A map of one entry (`key`) or a list of one element, its value the probe.
struct One<'p> {
    key: Option<&'static str>,
    value: Option<Probe<'p>>,
}

impl<'de> MapAccess<'de> for One<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.key.take() {
            Some(k) => seed.deserialize(k.into_deserializer()).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Error> {
        seed.deserialize(self.value.take().expect("a value after its key"))
    }
}

impl<'de> SeqAccess<'de> for One<'_> {
    type Error = Error;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, Error> {
        match self.value.take() {
            Some(probe) => seed.deserialize(probe).map(Some),
            None => Ok(None),
        }
    }
}

/// The keys a TOML text names, as `table.key`, set or commented out (`# key = value`): a table's
/// own name (`[state]`, `[models."ID"]`, `[[policy]]`) is a key too; quoted parts of a header (a
/// model's, band's or tenant's name) are left out, so the example quotes every such name.
fn named_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let mut table = String::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_start_matches('[');
            let Some(end) = header.find(']') else {
                continue;
            };
            // A quoted part (`"qwen2.5-7b"`) names an entry, not a key: drop it, dots and all.
            let bare: String = header[..end].split('"').step_by(2).collect();
            let parts: Vec<&str> = bare
                .split('.')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect();
            if parts.is_empty() || !parts.iter().all(|p| is_bare_key(p)) {
                continue;
            }
            table = parts.join(".");
            keys.insert(table.clone());
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if is_bare_key(key) && !value.trim().is_empty() {
            keys.insert(if table.is_empty() {
                key.to_owned()
            } else {
                format!("{table}.{key}")
            });
        }
    }
    keys
}

/// A TOML bare key as slotgate's keys are spelled: lower case, digits and `-`.
fn is_bare_key(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}
