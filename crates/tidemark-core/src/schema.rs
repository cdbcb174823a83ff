use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::name::validate_field_name;
use crate::CoreError;

/// The type of one event field. Every field is nullable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum FieldType {
    Boolean,
    /// i8
    Byte,
    /// i16
    Short,
    /// i32
    Integer,
    /// i64
    Long,
    /// f32
    Float,
    /// f64
    Double,
    /// UTF-8 text
    String,
    /// Opaque bytes
    Bytes,
}

impl FieldType {
    pub const ALL: [FieldType; 9] = [
        FieldType::Boolean,
        FieldType::Byte,
        FieldType::Short,
        FieldType::Integer,
        FieldType::Long,
        FieldType::Float,
        FieldType::Double,
        FieldType::String,
        FieldType::Bytes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FieldType::Boolean => "BOOLEAN",
            FieldType::Byte => "BYTE",
            FieldType::Short => "SHORT",
            FieldType::Integer => "INTEGER",
            FieldType::Long => "LONG",
            FieldType::Float => "FLOAT",
            FieldType::Double => "DOUBLE",
            FieldType::String => "STRING",
            FieldType::Bytes => "BYTES",
        }
    }

    /// Whether min/max/sum/avg are defined (booleans count as 0 and 1).
    pub fn is_numeric(self) -> bool {
        !matches!(self, FieldType::String | FieldType::Bytes)
    }

    /// A stable one-byte code used in the on-disk formats.
    pub fn code(self) -> u8 {
        match self {
            FieldType::Boolean => 1,
            FieldType::Byte => 2,
            FieldType::Short => 3,
            FieldType::Integer => 4,
            FieldType::Long => 5,
            FieldType::Float => 6,
            FieldType::Double => 7,
            FieldType::String => 8,
            FieldType::Bytes => 9,
        }
    }

    pub fn from_code(code: u8) -> Option<FieldType> {
        FieldType::ALL.into_iter().find(|t| t.code() == code)
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FieldType {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.trim().to_ascii_uppercase();
        let ty = match upper.as_str() {
            "BOOLEAN" | "BOOL" => FieldType::Boolean,
            "BYTE" | "TINYINT" => FieldType::Byte,
            "SHORT" | "SMALLINT" => FieldType::Short,
            "INTEGER" | "INT" => FieldType::Integer,
            "LONG" | "BIGINT" => FieldType::Long,
            "FLOAT" | "REAL" => FieldType::Float,
            "DOUBLE" => FieldType::Double,
            "STRING" | "TEXT" | "VARCHAR" => FieldType::String,
            "BYTES" | "BLOB" => FieldType::Bytes,
            _ => return Err(CoreError::UnknownType(s.to_string())),
        };
        Ok(ty)
    }
}

/// One named, typed, nullable field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: FieldType,
}

impl Field {
    pub fn new(name: impl Into<String>, ty: FieldType) -> Field {
        Field {
            name: name.into(),
            ty,
        }
    }
}

/// The fields of a stream's events (besides `tstart` and `tend`, which every event has).
///
/// Field names match case-insensitively and keep their declared spelling; two fields whose
/// names differ only in case are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<Field>", into = "Vec<Field>")]
pub struct Schema {
    fields: Vec<Field>,
}

/// The most fields one stream may declare.
pub const MAX_FIELDS: usize = 1024;

impl Schema {
    /// Checks what only a schema for a new stream must meet (see
    /// [`crate::name::validate_new_field_name`]).
    pub fn validate_new(&self) -> Result<(), CoreError> {
        self.fields
            .iter()
            .try_for_each(|f| crate::name::validate_new_field_name(&f.name))
    }

    pub fn new(fields: Vec<Field>) -> Result<Schema, CoreError> {
        if fields.len() > MAX_FIELDS {
            return Err(CoreError::InvalidSchema(format!(
                "{} fields, at most {MAX_FIELDS} are allowed",
                fields.len()
            )));
        }
        // A set, not pairwise comparisons: every APPEND of a wide schema (hundreds of metric
        // fields) builds one, and pairwise checks were a tenth of the server's CPU in W2.
        let mut seen = std::collections::HashSet::with_capacity(fields.len());
        for field in &fields {
            validate_field_name(&field.name)?;
            if !seen.insert(field.name.to_ascii_lowercase()) {
                return Err(CoreError::InvalidSchema(format!(
                    "field {:?} declared twice (names are case-insensitive)",
                    field.name
                )));
            }
        }
        Ok(Schema { fields })
    }

    /// Whether `other` declares the same fields in the same order, names compared
    /// case-insensitively (as everywhere else).
    pub fn matches(&self, other: &Schema) -> bool {
        self.fields.len() == other.fields.len()
            && self
                .fields
                .iter()
                .zip(&other.fields)
                .all(|(a, b)| a.ty == b.ty && a.name.eq_ignore_ascii_case(&b.name))
    }

    /// Whether this schema begins with every field of `older`, in order, with the same
    /// names and types: what a stream's schema is to every schema it had before, since a
    /// schema only ever grows by fields added at its end ([`Schema::with_added`]).
    pub fn extends(&self, older: &Schema) -> bool {
        older.fields.len() <= self.fields.len()
            && self.fields.iter().zip(&older.fields).all(|(a, b)| a == b)
    }

    /// This schema with `added` appended, skipping those it already has with the same type
    /// (names compared case-insensitively). A field it has with another type is refused:
    /// a field's type never changes.
    pub fn with_added(&self, added: &[Field]) -> Result<Schema, CoreError> {
        let mut fields = self.fields.clone();
        for field in added {
            match fields
                .iter()
                .find(|f| f.name.eq_ignore_ascii_case(&field.name))
            {
                Some(existing) if existing.ty == field.ty => {}
                Some(existing) => {
                    return Err(CoreError::InvalidSchema(format!(
                        "field {:?} is {}, it cannot be added as {}",
                        existing.name, existing.ty, field.ty
                    )))
                }
                None => fields.push(field.clone()),
            }
        }
        Schema::new(fields)
    }

    /// Parses `NAME:TYPE,NAME:TYPE,...`, e.g. `SYMBOL:STRING,LASTTRADEPRICE:FLOAT`.
    /// An empty spec is a schema with no fields.
    pub fn parse_spec(spec: &str) -> Result<Schema, CoreError> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Schema::new(Vec::new());
        }
        let fields = spec
            .split(',')
            .map(|part| {
                let (name, ty) = part.split_once(':').ok_or_else(|| {
                    CoreError::InvalidSchema(format!("{part:?} is not NAME:TYPE"))
                })?;
                Ok(Field::new(name.trim(), ty.parse()?))
            })
            .collect::<Result<Vec<_>, CoreError>>()?;
        Schema::new(fields)
    }

    /// Whether `spec` names this schema's fields and types in order, exactly as
    /// [`Schema::parse_spec`] then [`Schema::matches`] would find, without building a
    /// schema: every binary APPEND carries its spec, and parsing hundreds of fields per
    /// request was a fifth of the server's CPU in W2. Types must be spelled as
    /// [`FieldType::name`] gives them (any case); a spec using an alias answers false, and
    /// the caller falls back to parsing.
    pub fn is_described_by(&self, spec: &str) -> bool {
        let spec = spec.trim();
        if spec.is_empty() {
            return self.fields.is_empty();
        }
        let mut parts = spec.split(',');
        for field in &self.fields {
            let Some((name, ty)) = parts.next().and_then(|part| part.split_once(':')) else {
                return false;
            };
            if !name.trim().eq_ignore_ascii_case(&field.name)
                || !ty.trim().eq_ignore_ascii_case(field.ty.name())
            {
                return false;
            }
        }
        parts.next().is_none()
    }

    /// The schema in the spec syntax that [`Schema::parse_spec`] reads.
    pub fn to_spec(&self) -> String {
        self.fields
            .iter()
            .map(|f| format!("{}:{}", f.name, f.ty))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The position of a field, matched case-insensitively.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.fields
            .iter()
            .position(|f| f.name.eq_ignore_ascii_case(name))
    }

    /// Like [`Schema::index_of`] but an unknown name is an error.
    pub fn require(&self, name: &str) -> Result<usize, CoreError> {
        self.index_of(name)
            .ok_or_else(|| CoreError::UnknownField(name.to_string()))
    }

    /// The schema of the given field positions, in that order.
    pub fn project(&self, indices: &[usize]) -> Schema {
        Schema {
            fields: indices.iter().map(|&i| self.fields[i].clone()).collect(),
        }
    }
}

impl TryFrom<Vec<Field>> for Schema {
    type Error = CoreError;

    fn try_from(fields: Vec<Field>) -> Result<Self, Self::Error> {
        Schema::new(fields)
    }
}

impl From<Schema> for Vec<Field> {
    fn from(schema: Schema) -> Self {
        schema.fields
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_spec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_w1_schema() {
        let s = Schema::parse_spec("SYMBOL:STRING, SECURITYTYPE:integer ,LASTTRADEPRICE:FLOAT")
            .unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(
            s.fields()[1],
            Field::new("SECURITYTYPE", FieldType::Integer)
        );
        assert_eq!(s.index_of("lastTradePrice"), Some(2));
        assert_eq!(
            s.to_spec(),
            "SYMBOL:STRING,SECURITYTYPE:INTEGER,LASTTRADEPRICE:FLOAT"
        );
        assert_eq!(Schema::parse_spec(&s.to_spec()).unwrap(), s);
    }

    #[test]
    fn refuses_bad_specs() {
        for bad in [
            "A",
            "A:WHAT",
            "A:INT,a:LONG",
            ":INT",
            "tstart:LONG",
            "A:INT,,B:INT",
        ] {
            assert!(Schema::parse_spec(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn type_codes_round_trip() {
        for ty in FieldType::ALL {
            assert_eq!(FieldType::from_code(ty.code()), Some(ty));
        }
        assert_eq!(FieldType::from_code(0), None);
    }

    #[test]
    fn serde_validates() {
        let bad = r#"[{"name":"a","type":"LONG"},{"name":"A","type":"LONG"}]"#;
        assert!(serde_json::from_str::<Schema>(bad).is_err());
    }

    #[test]
    fn described_by_agrees_with_parsing() {
        let schema = Schema::parse_spec("SYMBOL:STRING,price:DOUBLE,N:INTEGER").unwrap();
        for spec in [
            "SYMBOL:STRING,price:DOUBLE,N:INTEGER",
            " symbol : string , PRICE:double,n:INTEGER ",
            "SYMBOL:STRING,price:DOUBLE",
            "SYMBOL:STRING,price:DOUBLE,N:INTEGER,X:LONG",
            "SYMBOL:STRING,N:INTEGER,price:DOUBLE",
            "SYMBOL:STRING,price:FLOAT,N:INTEGER",
            "SYMBOL:TEXT,price:DOUBLE,N:INT",
            "SYMBOL:STRING,price:DOUBLE,N",
            "",
        ] {
            let parsed = Schema::parse_spec(spec).is_ok_and(|s| s.matches(&schema));
            let fast = schema.is_described_by(spec);
            // The fast answer is never yes where parsing says no; an alias may say no.
            assert!(!fast || parsed, "{spec:?}");
            if !spec.contains("TEXT") {
                assert_eq!(fast, parsed, "{spec:?}");
            }
        }
        assert!(Schema::new(Vec::new()).unwrap().is_described_by("  "));
    }

    #[test]
    fn a_schema_grows_at_its_end_and_never_retypes_a_field() {
        let old = Schema::parse_spec("host:STRING,usage:DOUBLE").unwrap();
        let new = old
            .with_added(&[
                Field::new("USAGE", FieldType::Double),
                Field::new("cores", FieldType::Long),
                Field::new("cores", FieldType::Long),
            ])
            .unwrap();
        assert_eq!(new.to_spec(), "host:STRING,usage:DOUBLE,cores:LONG");
        assert!(new.extends(&old) && new.extends(&new) && !old.extends(&new));
        let reordered = Schema::parse_spec("usage:DOUBLE,host:STRING,cores:LONG").unwrap();
        assert!(!reordered.extends(&old));
        let error = old
            .with_added(&[Field::new("usage", FieldType::String)])
            .unwrap_err();
        assert!(error.to_string().contains("\"usage\" is DOUBLE"), "{error}");
        assert!(old
            .with_added(&[Field::new("tstart", FieldType::Long)])
            .is_err());
    }
}
