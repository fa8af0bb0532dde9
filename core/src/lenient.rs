//! A value read leniently: what does not have the expected shape is kept as it was, with the
//! reason, so that one bad entry of a list fails alone and is written back unchanged.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Debug, PartialEq)]
pub enum Lenient<T> {
    Valid(T),
    Invalid {
        value: serde_json::Value,
        error: String,
    },
}

impl<T> Lenient<T> {
    /// The value, or why it could not be read.
    pub fn valid(&self) -> Result<&T, &str> {
        match self {
            Lenient::Valid(value) => Ok(value),
            Lenient::Invalid { error, .. } => Err(error),
        }
    }
}

impl<T: Default> Default for Lenient<T> {
    fn default() -> Self {
        Lenient::Valid(T::default())
    }
}

impl<T> From<T> for Lenient<T> {
    fn from(value: T) -> Self {
        Lenient::Valid(value)
    }
}

impl<T: Serialize> Serialize for Lenient<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Lenient::Valid(value) => value.serialize(serializer),
            Lenient::Invalid { value, .. } => value.serialize(serializer),
        }
    }
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        Ok(match T::deserialize(&value) {
            Ok(typed) => Lenient::Valid(typed),
            Err(e) => Lenient::Invalid {
                value,
                error: e.to_string(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Port {
        port: u16,
    }

    #[test]
    fn a_bad_entry_fails_alone_and_is_written_back_as_it_was() {
        let list: Vec<Lenient<Port>> =
            serde_json::from_value(json!([{"port": 80}, {"port": "eighty"}])).unwrap();
        assert_eq!(list[0], Lenient::Valid(Port { port: 80 }));
        let Err(error) = list[1].valid() else {
            panic!("{:?} read as valid", list[1]);
        };
        assert!(error.contains("invalid type"), "{error}");
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            json!([{"port": 80}, {"port": "eighty"}])
        );
    }
}
