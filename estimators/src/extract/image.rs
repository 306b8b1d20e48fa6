//! What an image costs: its size read from the first bytes of its file (PNG, JPEG, GIF, WebP),
//! and the provider's rule that turns a size into tokens.

use super::tree::Tree;

/// Width and height in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageSize {
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// How a provider turns an image into tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ImageRule {
    /// OpenAI's tiles (GPT-4o, GPT-4.1, o-series): `detail: low` costs 85; `high` and `auto`
    /// fit the image into 2048 × 2048, scale its short side to 768, then cost 170 per 512-px
    /// tile plus 85.
    Tiles,
    /// OpenAI's 32-px patches (gpt-4.1-mini, gpt-4.1-nano, o4-mini): one per patch, at most
    /// 1,536, times the model's multiplier.
    Patches {
        /// Tokens per patch (1.62 for gpt-4.1-mini, 2.46 for gpt-4.1-nano, 1.72 for o4-mini).
        multiplier: f64,
    },
    /// OpenAI's tiles at a model's own figures: `detail: low` costs `base`; `high` and `auto`
    /// cost `base` plus `tile` per 512-px tile (gpt-4o-mini: 2,833 and 5,667; o1 and o3: 75
    /// and 150; gpt-5: 70 and 140).
    TilesAt {
        /// What the image costs before its tiles (and all it costs at `detail: low`).
        base: u64,
        /// What each 512-px tile costs.
        tile: u64,
    },
}

impl ImageRule {
    /// The rule OpenAI publishes for `model` (its vision guide, "Calculating costs"), when the
    /// model is one it names: patches for gpt-4.1-mini and -nano, gpt-5-mini and -nano and
    /// o4-mini; tiles at the model's own figures for gpt-4o-mini, o1, o3, gpt-5 and
    /// computer-use-preview; 85 and 170 for gpt-4o, gpt-4.1 and gpt-4.5. A dated snapshot takes
    /// its family's rule, and a fine-tune (`ft:...`) its base model's.
    ///
    /// ```
    /// use tollgate_estimators::ImageRule;
    ///
    /// assert_eq!(
    ///     ImageRule::for_model("gpt-4o-mini-2024-07-18"),
    ///     Some(ImageRule::TilesAt { base: 2_833, tile: 5_667 })
    /// );
    /// assert_eq!(
    ///     ImageRule::for_model("ft:gpt-4o-mini-2024-07-18:acme::abc123"),
    ///     Some(ImageRule::TilesAt { base: 2_833, tile: 5_667 })
    /// );
    /// assert_eq!(ImageRule::for_model("claude-sonnet-4"), None);
    /// ```
    pub fn for_model(model: &str) -> Option<ImageRule> {
        // A fine-tune (`ft:gpt-4o-mini-2024-07-18:org::id`) reads images as its base model.
        let model = model.strip_prefix("ft:").unwrap_or(model);
        let is = |name: &str| {
            model
                .strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', ':', '@', '.']))
        };
        let patches = |multiplier| Some(ImageRule::Patches { multiplier });
        let tiles = |base, tile| Some(ImageRule::TilesAt { base, tile });
        if is("gpt-4.1-mini") || is("gpt-5-mini") {
            patches(1.62)
        } else if is("gpt-4.1-nano") || is("gpt-5-nano") {
            patches(2.46)
        } else if is("o4-mini") {
            patches(1.72)
        } else if is("gpt-4o-mini") {
            tiles(2_833, 5_667)
        } else if is("o1") || is("o1-pro") || is("o3") || is("o3-pro") {
            tiles(75, 150)
        } else if is("computer-use-preview") {
            tiles(65, 129)
        } else if is("gpt-5") {
            tiles(70, 140)
        } else if is("gpt-4o")
            || is("gpt-4.1")
            || is("gpt-4.5")
            || is("chatgpt-4o")
            || is("gpt-4-turbo")
        {
            Some(ImageRule::Tiles)
        } else {
            None
        }
    }
}

/// The cost of an image the counter can't see the size of (a remote URL), and other choices of
/// billing that the caller may make.
///
/// ```
/// use tollgate_estimators::{Billing, ImageSize};
///
/// // Remote images of at most 1024 × 1024.
/// let billing = Billing::default().remote_image_size(ImageSize { width: 1024, height: 1024 });
/// assert_eq!(billing.remote_openai_tokens(), 765);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Billing {
    remote: Option<ImageSize>,
    rule: Option<ImageRule>,
}

impl Default for Billing {
    /// Remote images cost the most an image can cost: 1,445 tokens under OpenAI's tiles (a
    /// 2048 × 768 image), 1,536 patches under its patches, and 1,600 for Anthropic.
    fn default() -> Billing {
        Billing {
            remote: None,
            rule: None,
        }
    }
}

impl Billing {
    /// Bills remote images (URLs the counter can't fetch) as images of `size`.
    pub fn remote_image_size(self, size: ImageSize) -> Billing {
        Billing {
            remote: Some(size),
            ..self
        }
    }

    /// Bills OpenAI images by `rule` (the request's model's: see [`ImageRule::for_model`])
    /// rather than the estimator's.
    ///
    /// ```
    /// use tollgate_estimators::{Billing, ImageRule, Words, estimate_with};
    ///
    /// let body = serde_json::json!({"messages": [{"role": "user", "content": [
    ///     {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}]}]});
    /// let mini = Billing::default().image_rule(ImageRule::TilesAt { base: 2_833, tile: 5_667 });
    /// let tokens = estimate_with(&Words, &body, &mini)?.input_tokens;
    /// assert!(tokens >= 2_833);
    /// # Ok::<(), tollgate_estimators::ExtractError>(())
    /// ```
    pub fn image_rule(self, rule: ImageRule) -> Billing {
        Billing {
            rule: Some(rule),
            ..self
        }
    }

    /// The rule set by [`image_rule`](Billing::image_rule), if any.
    pub(crate) fn rule(&self) -> Option<ImageRule> {
        self.rule
    }

    /// What a remote image costs under OpenAI's tiles at high detail.
    pub fn remote_openai_tokens(&self) -> u64 {
        match self.remote {
            Some(size) => tiles(size),
            None => MAX_TILES_TOKENS,
        }
    }

    pub(crate) fn remote(&self) -> Option<ImageSize> {
        self.remote
    }
}

/// The most OpenAI's tile rule can charge: a 2048 × 768 image is 4 × 2 tiles.
const MAX_TILES_TOKENS: u64 = 8 * 170 + 85;
/// The most an Anthropic image costs: images are scaled to about 1.15 megapixels (~1,600
/// tokens).
const MAX_ANTHROPIC_TOKENS: u64 = 1_600;
const MAX_PATCHES: u64 = 1_536;

/// The most tiles an image can make under OpenAI's tile rule.
const MAX_TILES: u64 = 8;

/// OpenAI's tile rule at high detail.
pub(crate) fn tiles(size: ImageSize) -> u64 {
    170 * tile_count(size) + 85
}

/// How many 512-px tiles an image makes at high detail.
fn tile_count(size: ImageSize) -> u64 {
    let (mut w, mut h) = (f64::from(size.width.max(1)), f64::from(size.height.max(1)));
    // Fit into 2048 × 2048.
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    // Scale the short side to 768 (only down, never up).
    let short = (768.0 / w.min(h)).min(1.0);
    w *= short;
    h *= short;
    (w / 512.0).ceil() as u64 * (h / 512.0).ceil() as u64
}

fn patches(size: ImageSize, multiplier: f64) -> u64 {
    let across = u64::from(size.width).div_ceil(32).max(1);
    let down = u64::from(size.height).div_ceil(32).max(1);
    // Past the cap the image is scaled down to fit: the cap bounds it from above.
    let patches = across.saturating_mul(down).min(MAX_PATCHES);
    (patches as f64 * multiplier).ceil() as u64
}

/// Anthropic's rule: about (width × height) / 750 after the long edge is scaled to at most
/// 1568 px, and never more than its cap.
fn area(size: ImageSize) -> u64 {
    let (mut w, mut h) = (f64::from(size.width.max(1)), f64::from(size.height.max(1)));
    let fit = (1568.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    ((w * h / 750.0).ceil() as u64).min(MAX_ANTHROPIC_TOKENS)
}

/// An OpenAI image part: `image_url` (a URL string, or `{url, detail}`) with `detail` beside
/// it or inside it.
pub(crate) fn openai(
    image_url: &Tree,
    detail: Option<&str>,
    rule: ImageRule,
    billing: &Billing,
) -> u64 {
    let (url, detail) = match image_url {
        Tree::Str(url) => (Some(url.as_str()), detail),
        map => (
            map.get("url").and_then(Tree::as_str),
            map.get("detail").and_then(Tree::as_str).or(detail),
        ),
    };
    let size = url.and_then(data_url_size).or(billing.remote());
    match rule {
        ImageRule::Tiles if detail == Some("low") => 85,
        ImageRule::Tiles => size.map_or(MAX_TILES_TOKENS, tiles),
        ImageRule::TilesAt { base, .. } if detail == Some("low") => base,
        ImageRule::TilesAt { base, tile } => {
            let count = size.map_or(MAX_TILES, tile_count);
            base.saturating_add(tile.saturating_mul(count))
        }
        ImageRule::Patches { multiplier } => match size {
            Some(size) => patches(size, multiplier),
            None => (MAX_PATCHES as f64 * multiplier).ceil() as u64,
        },
    }
}

/// An Anthropic image block's `source`: `{type: "base64", media_type, data}` or
/// `{type: "url", url}`.
pub(crate) fn anthropic(source: &Tree, billing: &Billing) -> u64 {
    let size = match source.get("data").and_then(Tree::as_str) {
        Some(data) => file_size(&decode_prefix(data)),
        None => source
            .get("url")
            .and_then(Tree::as_str)
            .and_then(data_url_size),
    };
    size.or(billing.remote()).map_or(MAX_ANTHROPIC_TOKENS, area)
}

/// The size of the image in a `data:` URL, from its header.
fn data_url_size(url: &str) -> Option<ImageSize> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    if !meta.ends_with(";base64") {
        return None;
    }
    file_size(&decode_prefix(data))
}

/// Enough of the file to find its size in: the first 64 KB (a JPEG's size can come after
/// large metadata).
const PREFIX: usize = 64 << 10;

/// Base64 (standard or URL-safe, padding optional) decoded up to [`PREFIX`] bytes; decoding
/// stops at the first character that isn't base64.
fn decode_prefix(data: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX.min(data.len()));
    let mut buffer = 0u32;
    let mut bits = 0;
    for b in data.bytes() {
        let value = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            b'\n' | b'\r' | b' ' => continue,
            _ => break,
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            if out.len() >= PREFIX {
                break;
            }
        }
    }
    out
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

fn le16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_le_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

fn le24(b: &[u8], at: usize) -> Option<u32> {
    Some(
        u32::from(*b.get(at)?) | u32::from(*b.get(at + 1)?) << 8 | u32::from(*b.get(at + 2)?) << 16,
    )
}

/// The size of a PNG, JPEG, GIF or WebP image from the first bytes of its file.
pub fn file_size(bytes: &[u8]) -> Option<ImageSize> {
    let size = |width, height| Some(ImageSize { width, height });
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.get(12..16) == Some(b"IHDR") {
        let w = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?);
        let h = u32::from_be_bytes(bytes.get(20..24)?.try_into().ok()?);
        return size(w, h);
    }
    if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        return size(le16(bytes, 6)?, le16(bytes, 8)?);
    }
    if bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP") {
        return match bytes.get(12..16)? {
            b"VP8 " => size(le16(bytes, 26)? & 0x3fff, le16(bytes, 28)? & 0x3fff),
            b"VP8L" => {
                let bits = u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?);
                size((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
            }
            b"VP8X" => size(le24(bytes, 24)? + 1, le24(bytes, 27)? + 1),
            _ => None,
        };
    }
    if bytes.starts_with(&[0xff, 0xd8]) {
        // Walk the segments to the first start-of-frame marker.
        let mut at = 2;
        while at + 4 <= bytes.len() {
            if bytes[at] != 0xff {
                return None;
            }
            let marker = bytes[at + 1];
            if marker == 0xff {
                at += 1;
                continue;
            }
            let length = be16(bytes, at + 2)? as usize;
            let is_frame = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
            if is_frame {
                return size(be16(bytes, at + 7)?, be16(bytes, at + 5)?);
            }
            at += 2 + length;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_tiles_match_the_published_examples() {
        // OpenAI's own examples: 1024 × 1024 is 765 tokens, 2048 × 4096 is 1105.
        assert_eq!(
            tiles(ImageSize {
                width: 1024,
                height: 1024
            }),
            765
        );
        assert_eq!(
            tiles(ImageSize {
                width: 2048,
                height: 4096
            }),
            1105
        );
        assert_eq!(
            tiles(ImageSize {
                width: 2048,
                height: 768
            }),
            MAX_TILES_TOKENS
        );
        assert_eq!(
            tiles(ImageSize {
                width: 200,
                height: 100
            }),
            255
        );
    }

    #[test]
    fn patches_match_the_published_example() {
        // 1024 × 1024 is 32 × 32 patches; 1800 × 2400 is capped at 1,536.
        assert_eq!(
            patches(
                ImageSize {
                    width: 1024,
                    height: 1024
                },
                1.0
            ),
            1024
        );
        assert_eq!(
            patches(
                ImageSize {
                    width: 1800,
                    height: 2400
                },
                1.0
            ),
            1536
        );
        assert_eq!(
            patches(
                ImageSize {
                    width: 1024,
                    height: 1024
                },
                1.62
            ),
            1659
        );
    }

    #[test]
    fn anthropic_area_is_scaled_and_capped() {
        assert_eq!(
            area(ImageSize {
                width: 1000,
                height: 1000
            }),
            1334
        );
        assert_eq!(
            area(ImageSize {
                width: 200,
                height: 200
            }),
            54
        );
        assert_eq!(
            area(ImageSize {
                width: 8000,
                height: 8000
            }),
            MAX_ANTHROPIC_TOKENS
        );
    }
}
