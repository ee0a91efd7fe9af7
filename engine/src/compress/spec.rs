//! Codec specs: the strings users type (`topk:0.001`, `dither:linear:s=15:norm=max`, ...),
//! parsed into a [`CodecSpec`] that prints back in canonical form.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How many elements a sparsifier keeps: a fraction of the length or a fixed count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// `k = max(1, floor(fraction * n))` for n > 0.
    Fraction(f64),
    /// `k = min(count, n)`.
    Count(usize),
}

impl Amount {
    /// Elements kept out of `n`.
    pub fn of(self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        match self {
            Amount::Fraction(f) => ((f * n as f64).floor() as usize).clamp(1, n),
            Amount::Count(c) => c.min(n),
        }
    }

    /// Like [`Amount::of`] but rounding a fraction up (Clapping's `K = ceil(rho * d)`).
    pub fn of_ceil(self, n: usize) -> usize {
        match self {
            Amount::Fraction(f) if n > 0 => ((f * n as f64).ceil() as usize).clamp(1, n),
            other => other.of(n),
        }
    }

    /// A fraction of the tensor: `0.001`, `1e-3`, `1/32` or `1.0`. A bare integer is
    /// refused: `topk:2` could mean two elements or (mistyped) a fraction, so counts are
    /// written `k=2`.
    fn parse_fraction(s: &str) -> Result<Amount> {
        let bad = |why: &str| {
            Error::Config(format!(
                "{s:?} {why}: write a fraction of the tensor (0.001, 1e-3, 1/32 or 1.0) or a count as k=<elements>"
            ))
        };
        if let Some((a, b)) = s.split_once('/') {
            let (a, b): (f64, f64) = (
                a.parse().map_err(|_| bad("is not an amount"))?,
                b.parse().map_err(|_| bad("is not an amount"))?,
            );
            return Self::fraction(a / b).ok_or_else(|| bad("is not a fraction in (0, 1]"));
        }
        if s.contains('.') || s.contains('e') {
            let f = s.parse().map_err(|_| bad("is not an amount"))?;
            return Self::fraction(f).ok_or_else(|| bad("is not a fraction in (0, 1]"));
        }
        if s.parse::<u64>().is_ok() {
            return Err(bad("is ambiguous"));
        }
        Err(bad("is not an amount"))
    }

    /// A count of elements, at least 1 (the value of `k=`).
    fn parse_count(s: &str) -> Result<Amount> {
        match s.parse::<usize>() {
            Ok(c) if c > 0 => Ok(Amount::Count(c)),
            _ => Err(Error::Config(format!(
                "k={s}: the count of elements kept must be an integer of at least 1"
            ))),
        }
    }

    fn fraction(f: f64) -> Option<Amount> {
        (f > 0.0 && f <= 1.0).then_some(Amount::Fraction(f))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Debug keeps a decimal point ("1.0"), so a fraction never prints as a bare
            // integer, which would parse back as an ambiguous count.
            Amount::Fraction(x) => write!(f, "{x:?}"),
            Amount::Count(c) => write!(f, "k={c}"),
        }
    }
}

/// The norm whose value scales a dithering codec's levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// The largest magnitude, `max |v_i|`.
    Max,
    /// The Euclidean norm, `sqrt(sum v_i^2)`.
    L2,
}

/// How a dithering codec spaces its `s` levels between 0 and 1 (times the norm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Levels {
    /// `{0, 1/s, 2/s, ..., 1}`.
    Linear,
    /// `{0, 2^(1-s), ..., 1/2, 1}`.
    Natural,
}

/// How a quantizer maps a value to one of the two levels around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// To the nearest level (deterministic and biased).
    Nearest,
    /// Up or down at random, with the probabilities that make the result unbiased.
    Stochastic,
}

/// Every codec murmur implements, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CodecSpec {
    /// f32, unchanged.
    F32,
    /// IEEE half precision, round to nearest even.
    F16,
    /// bfloat16 (f32 with a 7-bit mantissa), round to nearest even.
    Bf16,
    /// `(|v|_1 / n) * sign(v)`, sign(0) = +.
    Sign,
    /// Scaled sign applied `rounds` times, each to what the previous left (Neolithic's FCC).
    SignRounds {
        /// Applications of scaled sign, at least 1.
        rounds: u32,
    },
    /// Exact top-k by magnitude; values as f16 when `f16_values`.
    TopK {
        /// How many elements to keep, a fraction of the tensor or a count.
        amount: Amount,
        /// Whether the kept values travel as f16 instead of f32.
        f16_values: bool,
    },
    /// k coordinates without replacement; `shared_seed` sends values only; `scaled`
    /// multiplies by n/k (unbiased).
    RandK {
        /// How many elements to keep, a fraction of the tensor or a count.
        amount: Amount,
        /// Whether every peer draws the same index set from the shared seed, so that only the
        /// values travel.
        shared_seed: bool,
        /// Whether the values are multiplied by n/k, which makes the codec unbiased.
        scaled: bool,
    },
    /// Stochastic rounding onto `s` levels of a norm.
    Dither {
        /// How the levels are spaced.
        levels: Levels,
        /// Number of nonzero levels.
        s: u32,
        /// The norm the levels are scaled by.
        norm: Norm,
    },
    /// Natural compression: sign and a power of two, stochastically rounded.
    Natural,
    /// QSGD-style b-bit quantization with a max-norm scale.
    Qsgd {
        /// Bits per element code, sign included.
        bits: u32,
        /// Whether values round to the nearest level or stochastically.
        rounding: Rounding,
    },
    /// LoCo's fixed-scale p-bit quantizer, scale 2^log2s, round half to even, saturating.
    Loco {
        /// Bits per element code (p), sign included; codes saturate at the range of p-bit two's
        /// complement.
        bits: u32,
        /// Log2 of the fixed scale s: a value v is coded as `round(v * 2^log2s)`.
        log2s: i32,
        /// The payload starts with the scale (f32 `2^log2s`) and decoders take the scale from
        /// there: a job that recalibrates s mid-run changes it without re-registering keys, and
        /// every logged reply says at which scale it was coded.
        rescalable: bool,
    },
    /// Block-absmax (ZeRO++) quantization, one scale per group of `group` elements.
    BlockQ {
        /// Bits per element code, sign included.
        bits: u32,
        /// Elements sharing one absmax scale.
        group: usize,
    },
    /// Clapping's hybrid: top-k support, kept values quantized to `bits`.
    Hybrid {
        /// Bits per kept value's code, sign included.
        bits: u32,
        /// How many elements the top-k support keeps, a fraction of the tensor or a count.
        amount: Amount,
    },
}

const HELP: &str =
    "codecs: f32, f16, bf16, sign[:rounds=R], topk:<k>[:f16], randk:<k>[:explicit][:unscaled], \
dither:linear|natural[:s=N|:bits=B][:norm=max|l2], natural, qsgd:bits=B[:stochastic], \
loco:bits=2|4|8[:log2s=N], blockq:bits=4|8[:group=N], hybrid:bits=B:topk=<fraction>|k=<count> \
(<k> is a fraction of the tensor such as 0.001 or 1/32, or a count written k=100)";

fn parse_u32(key: &str, v: &str, lo: u32, hi: u32) -> Result<u32> {
    match v.parse::<u32>() {
        Ok(x) if (lo..=hi).contains(&x) => Ok(x),
        _ => Err(Error::Config(format!(
            "{key}={v}: expected an integer from {lo} to {hi}"
        ))),
    }
}

impl CodecSpec {
    /// `log2 s` of a rescalable LoCo spec (whose payloads carry their scale); `None` for
    /// every other spec.
    pub fn rescalable_log2s(self) -> Option<i32> {
        match self {
            CodecSpec::Loco {
                log2s,
                rescalable: true,
                ..
            } => Some(log2s),
            _ => None,
        }
    }
}

impl FromStr for CodecSpec {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let mut parts = text.trim().split(':');
        let name = parts.next().unwrap_or("").to_ascii_lowercase();
        let args: Vec<&str> = parts.collect();
        let bad = |msg: String| Error::Config(format!("codec {text:?}: {msg}. {HELP}"));
        // key=value pairs and bare flags, in any order after the positional ones.
        let kv = |key: &str| {
            args.iter()
                .find_map(|a| a.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        };
        let flag = |f: &str| args.contains(&f);
        let known = |allowed: &[&str]| -> Result<()> {
            for a in &args {
                let k = a.split('=').next().unwrap_or("");
                if !allowed.contains(&k) && !a.chars().next().is_some_and(|c| c.is_ascii_digit()) {
                    return Err(bad(format!("unknown option {a:?}")));
                }
            }
            Ok(())
        };
        // How many elements a sparsifier keeps: the fraction under `fraction_key` (the
        // first positional argument when None), or a count `k=N`, not both.
        let amount = |fraction_key: Option<&str>| -> Result<Amount> {
            let fraction = match fraction_key {
                Some(key) => kv(key),
                None => args
                    .iter()
                    .copied()
                    .find(|a| a.starts_with(|c: char| c.is_ascii_digit() || c == '.')),
            };
            match (fraction, kv("k")) {
                (Some(f), None) => Amount::parse_fraction(f).map_err(|e| bad(e.to_string())),
                (None, Some(k)) => Amount::parse_count(k).map_err(|e| bad(e.to_string())),
                (Some(_), Some(_)) => Err(bad("give a fraction or k=<count>, not both".into())),
                (None, None) => Err(bad("needs a fraction of the tensor or k=<count>".into())),
            }
        };
        let spec = match name.as_str() {
            "f32" | "identity" | "none" => CodecSpec::F32,
            "f16" | "fp16" => CodecSpec::F16,
            "bf16" => CodecSpec::Bf16,
            "sign" | "onebit" => {
                known(&["rounds"])?;
                match kv("rounds")
                    .map(|r| parse_u32("rounds", r, 1, 8))
                    .transpose()?
                {
                    None | Some(1) => CodecSpec::Sign,
                    Some(rounds) => CodecSpec::SignRounds { rounds },
                }
            }
            "topk" => {
                known(&["f16", "k"])?;
                CodecSpec::TopK {
                    amount: amount(None)?,
                    f16_values: flag("f16"),
                }
            }
            "randk" => {
                known(&["explicit", "scaled", "unscaled", "k"])?;
                if flag("scaled") && flag("unscaled") {
                    return Err(bad("scaled and unscaled both given".into()));
                }
                CodecSpec::RandK {
                    amount: amount(None)?,
                    shared_seed: !flag("explicit"),
                    scaled: !flag("unscaled"),
                }
            }
            "dither" => {
                known(&["linear", "natural", "s", "bits", "norm"])?;
                let levels = match (flag("linear"), flag("natural")) {
                    (true, false) => Levels::Linear,
                    (false, true) => Levels::Natural,
                    _ => return Err(bad("say linear or natural".into())),
                };
                let s = match (kv("s"), kv("bits")) {
                    (Some(s), None) => parse_u32("s", s, 1, 127)?,
                    (None, Some(b)) => (1u32 << (parse_u32("bits", b, 2, 8)? - 1)) - 1,
                    (None, None) => return Err(bad("give s=<levels> or bits=<b>".into())),
                    _ => return Err(bad("give s or bits, not both".into())),
                };
                if levels == Levels::Natural && s > 24 {
                    return Err(bad(format!("natural dithering takes s up to 24 (levels down to 2^-23 of the norm), not {s}")));
                }
                let norm = match kv("norm").unwrap_or("max") {
                    "max" => Norm::Max,
                    "l2" => Norm::L2,
                    other => return Err(bad(format!("norm={other}: use max or l2"))),
                };
                CodecSpec::Dither { levels, s, norm }
            }
            "natural" => CodecSpec::Natural,
            "qsgd" => {
                known(&["bits", "stochastic", "nearest"])?;
                let bits = parse_u32(
                    "bits",
                    kv("bits").ok_or_else(|| bad("needs bits=<2..8>".into()))?,
                    2,
                    8,
                )?;
                CodecSpec::Qsgd {
                    bits,
                    rounding: if flag("stochastic") {
                        Rounding::Stochastic
                    } else {
                        Rounding::Nearest
                    },
                }
            }
            "loco" => {
                known(&["bits", "log2s", "rescalable"])?;
                // LoCo packs its codes whole into bytes: 2, 4 or 8 bits.
                let bits = match kv("bits").unwrap_or("4") {
                    b @ ("2" | "4" | "8") => b.parse().expect("a digit"),
                    other => {
                        return Err(bad(format!("bits={other}: LoCo codes take 2, 4 or 8 bits")))
                    }
                };
                let log2s = match kv("log2s").unwrap_or("19").parse::<i32>() {
                    Ok(v) if (-100..=100).contains(&v) => v,
                    _ => return Err(bad("log2s must be an integer from -100 to 100".into())),
                };
                CodecSpec::Loco {
                    bits,
                    log2s,
                    rescalable: flag("rescalable"),
                }
            }
            "blockq" => {
                known(&["bits", "group"])?;
                let bits = parse_u32("bits", kv("bits").unwrap_or("4"), 2, 8)?;
                let group = kv("group")
                    .unwrap_or("2048")
                    .parse::<usize>()
                    .ok()
                    .filter(|&g| g > 0)
                    .ok_or_else(|| bad("group must be a positive integer".into()))?;
                CodecSpec::BlockQ { bits, group }
            }
            "hybrid" => {
                known(&["bits", "topk", "k"])?;
                let bits = parse_u32("bits", kv("bits").unwrap_or("6"), 2, 8)?;
                CodecSpec::Hybrid {
                    bits,
                    amount: amount(Some("topk"))?,
                }
            }
            _ => return Err(bad("no such codec".into())),
        };
        Ok(spec)
    }
}

impl fmt::Display for CodecSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecSpec::F32 => write!(f, "f32"),
            CodecSpec::F16 => write!(f, "f16"),
            CodecSpec::Bf16 => write!(f, "bf16"),
            CodecSpec::Sign => write!(f, "sign"),
            CodecSpec::SignRounds { rounds } => write!(f, "sign:rounds={rounds}"),
            CodecSpec::TopK { amount, f16_values } => {
                write!(f, "topk:{amount}{}", if *f16_values { ":f16" } else { "" })
            }
            CodecSpec::RandK {
                amount,
                shared_seed,
                scaled,
            } => write!(
                f,
                "randk:{amount}{}{}",
                if *shared_seed { "" } else { ":explicit" },
                if *scaled { "" } else { ":unscaled" }
            ),
            CodecSpec::Dither { levels, s, norm } => write!(
                f,
                "dither:{}:s={s}:norm={}",
                if *levels == Levels::Linear {
                    "linear"
                } else {
                    "natural"
                },
                if *norm == Norm::Max { "max" } else { "l2" }
            ),
            CodecSpec::Natural => write!(f, "natural"),
            CodecSpec::Qsgd { bits, rounding } => {
                write!(
                    f,
                    "qsgd:bits={bits}{}",
                    if *rounding == Rounding::Stochastic {
                        ":stochastic"
                    } else {
                        ""
                    }
                )
            }
            CodecSpec::Loco {
                bits,
                log2s,
                rescalable,
            } => {
                write!(f, "loco:bits={bits}:log2s={log2s}")?;
                if *rescalable {
                    write!(f, ":rescalable")?;
                }
                Ok(())
            }
            CodecSpec::BlockQ { bits, group } => write!(f, "blockq:bits={bits}:group={group}"),
            CodecSpec::Hybrid { bits, amount } => match amount {
                Amount::Fraction(_) => write!(f, "hybrid:bits={bits}:topk={amount}"),
                Amount::Count(_) => write!(f, "hybrid:bits={bits}:{amount}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_canonically() {
        for (input, canonical) in [
            ("f32", "f32"),
            ("identity", "f32"),
            ("sign", "sign"),
            ("sign:rounds=2", "sign:rounds=2"),
            ("sign:rounds=1", "sign"),
            ("topk:0.001", "topk:0.001"),
            ("topk:k=100:f16", "topk:k=100:f16"),
            ("topk:f16:k=100", "topk:k=100:f16"),
            ("topk:1.0", "topk:1.0"),
            ("topk:1e-5", "topk:1e-5"),
            ("randk:k=7:explicit", "randk:k=7:explicit"),
            ("hybrid:bits=6:k=12", "hybrid:bits=6:k=12"),
            ("randk:1/32", "randk:0.03125"),
            ("randk:0.5:explicit:unscaled", "randk:0.5:explicit:unscaled"),
            ("dither:linear:s=15:norm=max", "dither:linear:s=15:norm=max"),
            (
                "dither:natural:bits=3:norm=l2",
                "dither:natural:s=3:norm=l2",
            ),
            ("qsgd:bits=6:stochastic", "qsgd:bits=6:stochastic"),
            ("loco:bits=4:log2s=19", "loco:bits=4:log2s=19"),
            ("loco", "loco:bits=4:log2s=19"),
            ("blockq:bits=8:group=64", "blockq:bits=8:group=64"),
            ("hybrid:bits=6:topk=0.3", "hybrid:bits=6:topk=0.3"),
        ] {
            let spec: CodecSpec = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(spec.to_string(), canonical, "{input}");
            assert_eq!(
                canonical.parse::<CodecSpec>().unwrap(),
                spec,
                "round trip of {canonical}"
            );
        }
    }

    #[test]
    fn bad_specs_explain_themselves() {
        for bad in [
            "",
            "zip",
            "topk",
            "topk:0",
            "topk:2",
            "topk:k=0",
            "topk:k=0.5",
            "topk:0.1:k=3",
            "randk:7",
            "hybrid:bits=6:topk=12",
            "loco:bits=3",
            "loco:bits=16",
            "topk:1.5",
            "topk:abc",
            "dither:s=3",
            "dither:linear",
            "qsgd:bits=9",
            "loco:bits=4:foo=1",
            "randk:0.1:scaled:unscaled",
            "sign:rounds=0",
            "sign:rounds=9",
        ] {
            let err = bad.parse::<CodecSpec>().unwrap_err().to_string();
            assert!(
                err.contains("codec") || err.contains("amount") || err.contains("expected"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn amounts_round_as_documented() {
        assert_eq!(Amount::Fraction(0.001).of(16_000_000), 16_000);
        assert_eq!(Amount::Fraction(0.001).of(10), 1, "at least one element");
        assert_eq!(Amount::Fraction(0.3).of_ceil(10), 3);
        assert_eq!(Amount::Fraction(0.31).of_ceil(10), 4);
        assert_eq!(Amount::Count(5).of(3), 3);
        assert_eq!(Amount::Count(5).of(0), 0);
    }
}
