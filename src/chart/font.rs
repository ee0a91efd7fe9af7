//! The font that bitmap figures are drawn with. plotters' default text path asks the system's
//! fontconfig and FreeType, which a bare machine lacks; with its `ab_glyph` feature it draws
//! only fonts handed to it, so the binary carries DejaVu Sans (assets/fonts/, with its
//! licence beside it).

use std::sync::{Once, OnceLock};

use ab_glyph::FontRef;
use plotters::style::{register_font, FontStyle};

static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Makes the font the one every text of a figure uses ("sans-serif"); once per process.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are compiled in and parsed by the tests: they cannot be invalid here.
        if register_font("sans-serif", FontStyle::Normal, DEJAVU_SANS).is_err() {
            unreachable!("the bundled DejaVu Sans parses");
        }
    });
}

/// The font, for drawing glyphs directly (see [`super::typeset`]).
pub fn dejavu() -> &'static FontRef<'static> {
    static FONT: OnceLock<FontRef<'static>> = OnceLock::new();
    FONT.get_or_init(|| match FontRef::try_from_slice(DEJAVU_SANS) {
        Ok(font) => font,
        Err(_) => unreachable!("the bundled DejaVu Sans parses"),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bundled_font_parses_and_has_the_glyphs_figures_use() {
        use ab_glyph::Font;
        super::register();
        let font = super::dejavu();
        for c in "azAZ09.,-±%()‖·".chars() {
            assert_ne!(font.glyph_id(c).0, 0, "no glyph for {c:?}");
        }
    }
}
