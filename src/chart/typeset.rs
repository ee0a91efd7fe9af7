//! A bitmap backend that draws text itself. plotters' `ab_glyph` text path (0.3.7) places
//! each glyph's bitmap at the pen without the glyph's left side bearing, so narrow glyphs
//! (".", "-", "l") sit off their cells and words look unevenly spaced. [`Typeset`] wraps a
//! backend and draws text with ab_glyph directly, bearings included; everything else, and
//! the layout boxes plotters sizes its labels by, stay plotters' own.

use ab_glyph::{Font, PxScale, ScaleFont};
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

use super::font;

/// `B`, with text drawn by [`Typeset::draw_text`].
pub struct Typeset<B>(pub B);

impl<B: DrawingBackend> DrawingBackend for Typeset<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        (iw, ih): (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        self.0.blit_bitmap(pos, (iw, ih), src)
    }

    /// Lays the text out as plotters does (its box, anchored and turned the same way), but
    /// puts each glyph where its outline says, left side bearing included.
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<B::ErrorType>> {
        let colour = style.color();
        if colour.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let turn = style.transform();
        let size = style.size() as f32;
        let font = font::dejavu().as_scaled(PxScale::from(size));
        let (w, h) = self.get_size();
        let mut pen = 0f32;
        let mut previous = None;
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = previous {
                pen += font.kern(p, id);
            }
            previous = Some(id);
            let glyph = id.with_scale_and_position(size, ab_glyph::point(pen, 0.0));
            pen += font.h_advance(id);
            let Some(outline) = font.outline_glyph(glyph) else {
                continue; // a space
            };
            let bounds = outline.px_bounds();
            // plotters' baseline: half the size below the top of the box.
            let (left, top) = (bounds.min.x as i32, (size / 2.0 + bounds.min.y) as i32);
            let mut pixels = Vec::new();
            outline.draw(|x, y, coverage| pixels.push((x as i32, y as i32, coverage)));
            for (x, y, coverage) in pixels {
                let (x, y) = turn.transform(left + x + dx - min_x, top + y + dy - min_y);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if x >= 0 && y >= 0 && x < w as i32 && y < h as i32 {
                    let alpha = colour.alpha * coverage as f64;
                    self.0
                        .draw_pixel((x, y), BackendColor { alpha, ..colour })?;
                }
            }
        }
        Ok(())
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<B::ErrorType>> {
        self.0.estimate_text_size(text, style)
    }
}
