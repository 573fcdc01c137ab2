// SPDX-License-Identifier: MIT
// The geometry shared by every shroud variant. Include it AFTER the parameters (see
// shroud_120.scad): it reads them as globals, checks them, and draws the shroud.
//
// Print orientation: the fan plate lies on the bed (z = 0), the duct narrows upwards and
// ends in a collar that slides over the card's tail end. x runs along the card's height,
// y along its thickness. Each fan gets its own loft from its round bore to its share of
// the inlet; with several fans a septum of wall thickness keeps their flows apart, and
// the valleys between the lofts leave every screw head reachable from above.
//
// Wall thickness: each outer loft starts from its bore grown by `inset` and ends at its inlet
// share grown by `top_gap` (>= inset), so the horizontal gap between inner and outer surface
// is at least `inset` at every height; `inset` = wall / cos(steepest lean) keeps the thickness
// square to the most steeply leaning wall at `wall`. tests/test_shrouds.py measures it.

// Most a|ux| + b|uy| reaches over unit vectors u (support of a lozenge-shaped term).
function max_lin(a, b) = (a > 0 || b > 0) ? sqrt(pow(max(a, 0), 2) + pow(max(b, 0), 2)) : max(a, b);

bore_r = fan_bore / 2;
fan_x = [for (i = [0 : fan_count - 1]) (i - (fan_count - 1) / 2) * fan_size];
// The inlet seen from inside the duct: the card's end face less the stop lip it rests on.
in_ax = card_height / 2 - stop_lip;
in_by = card_thickness / 2 - stop_lip;
collar_ax = card_height / 2 + clearance + wall;
collar_by = card_thickness / 2 + clearance + wall;
top_gap = stop_lip + clearance + wall;       // inner to outer at the top of the taper

function slot_hw(d) = (2 * in_ax - (fan_count - 1) * d) / fan_count / 2;
function slot_cx(i, d) = -in_ax + slot_hw(d) + i * (2 * slot_hw(d) + d);

// The bores run straight through the plate; the lofts start on top of it (no feather edge at
// the bed), and the inner ones end where the stop lip's straight face starts.
inner_length = taper_length - stop_lip_height - plate_thickness;
outer_length = taper_length - plate_thickness;

// Steepest lean (run over rise) of any duct surface, inner or outer, for an inset d.
function lean(d) = max([for (i = [0 : fan_count - 1]) let(
        off = abs(fan_x[i] - slot_cx(i, d)), hw = slot_hw(d),
        narrow_in = (bore_r + max_lin(off - hw, -in_by)) / inner_length,
        widen_in = (-bore_r + max_lin(off + hw, in_by)) / inner_length,
        narrow_out = (bore_r + d + max_lin(off - hw - top_gap, -in_by - top_gap)) / outer_length,
        widen_out = (-(bore_r + d) + max_lin(off + hw + top_gap, in_by + top_gap)) / outer_length)
    max(narrow_in, widen_in, narrow_out, widen_out)]);
// Overhangs only: the inner surface where the duct narrows, the outer where it widens.
function overhang_lean(d) = max([for (i = [0 : fan_count - 1]) let(
        off = abs(fan_x[i] - slot_cx(i, d)), hw = slot_hw(d),
        narrow_in = (bore_r + max_lin(off - hw, -in_by)) / inner_length,
        widen_out = (-(bore_r + d) + max_lin(off + hw + top_gap, in_by + top_gap)) / outer_length)
    max(narrow_in, widen_out, 0)]);

function settle(d, n) = n == 0 ? d : settle(wall * sqrt(1 + pow(lean(d), 2)), n - 1);
inset = settle(wall, 4);
overhang_deg = atan(overhang_lean(inset));
total_height = taper_length + collar_depth;
head_room = (fan_size - screw_spacing) / 2;  // plate edge to hole centre

// ---- parameter checks: a set that cannot work stops here, before any STL exists ----
assert(nozzle_width > 0, str("nozzle_width (", nozzle_width, " mm) must be positive"));
assert(wall >= 2 * nozzle_width, str("wall (", wall, " mm) is thinner than two perimeters of nozzle_width (",
       nozzle_width, " mm): at least ", 2 * nozzle_width, " mm"));
assert(plate_thickness >= 2 * nozzle_width, str("plate_thickness (", plate_thickness,
       " mm) is thinner than two perimeters of nozzle_width (", nozzle_width, " mm)"));
assert(fan_count >= 1 && fan_count == floor(fan_count), str("fan_count (", fan_count, ") must be a whole number >= 1"));
assert(fan_count * fan_size <= bed_x, str("fan_size (", fan_size, " mm x ", fan_count, " fans = ", fan_count * fan_size,
       " mm) is wider than the bed: bed_x is ", bed_x, " mm"));
assert(fan_size <= bed_y, str("fan_size (", fan_size, " mm) is deeper than the bed: bed_y is ", bed_y, " mm"));
assert(total_height <= bed_z, str("taper_length + collar_depth (", total_height, " mm) is taller than bed_z (",
       bed_z, " mm)"));
assert(2 * collar_ax <= bed_x && 2 * collar_by <= bed_y, str("card_height/card_thickness: the collar (",
       2 * collar_ax, " x ", 2 * collar_by, " mm) does not fit the bed (", bed_x, " x ", bed_y, " mm)"));
assert(overhang_deg <= max_overhang, str("taper_length (", taper_length, " mm) is too short: a duct wall leans ",
       overhang_deg, " degrees from vertical, more than max_overhang (", max_overhang, ")"));
assert(hole_d > 0 && hole_d < 2 * head_room - 2 * wall, str("hole_d (", hole_d, " mm) leaves less than wall (",
       wall, " mm) between the hole and the plate edge for screw_spacing ", screw_spacing, " mm"));
assert(screw_spacing > 0 && screw_spacing < fan_size, str("screw_spacing (", screw_spacing,
       " mm) must be positive and smaller than fan_size (", fan_size, " mm)"));
assert(fan_bore > 0 && fan_bore / 2 + inset <= fan_size / 2, str("fan_bore (", fan_bore,
       " mm) plus the duct wall (", inset, " mm a side) is wider than fan_size (", fan_size, " mm)"));
assert(fan_count == 1 || fan_size - fan_bore >= inset, str("fan_bore (", fan_bore, " mm) leaves less than the wall (",
       inset, " mm) between neighbouring fans of fan_size ", fan_size, " mm"));
assert(norm([screw_spacing / 2, screw_spacing / 2]) - screw_head_d / 2 >= bore_r + inset,
       str("screw_head_d (", screw_head_d, " mm): a screw head at screw_spacing ", screw_spacing,
           " mm would sit on the duct wall (fan_bore ", fan_bore, " mm)"));
assert(clearance >= 0, str("clearance (", clearance, " mm) must not be negative"));
assert(card_height > 0 && card_thickness > 0 && card_length > collar_depth, str(
       "card_height, card_thickness, card_length must be positive, and card_length longer than collar_depth"));
assert(stop_lip_height >= wall && stop_lip_height + plate_thickness < taper_length / 2, str("stop_lip_height (",
       stop_lip_height, " mm) must be at least wall (", wall, " mm), and with plate_thickness under half of ",
       "taper_length (", taper_length, " mm)"));
assert(stop_lip > 0 && stop_lip < card_thickness / 4, str("stop_lip (", stop_lip,
       " mm) must be positive and under a quarter of card_thickness (", card_thickness, " mm)"));
assert(top_gap >= inset, str("stop_lip (", stop_lip, " mm) + clearance is too small: the wall at the top of the taper",
       " would be thinner than ", inset, " mm"));
assert(slot_hw(inset) > wall, str("fan_count (", fan_count, ") splits card_height (", card_height,
       " mm) into inlets narrower than the wall"));
assert(collar_depth >= 2 * wall, str("collar_depth (", collar_depth, " mm) is too short to grip the card"));

echo(str("shroud: inset ", inset, " mm, steepest overhang ", overhang_deg, " deg, height ", total_height,
         " mm; card + shroud + fan reach ", card_length - collar_depth + total_height + fan_thickness,
         " mm from the bracket"));

// The convex hull of a circle at z0 and a rectangle at z1: the ideal loft, with no thin
// slabs (which leave sliver faces where two lofts meet).
module loft(r, x, ax, by, cx, z0, z1) {
    n = $fn;
    points = concat([for (k = [0 : n - 1]) [x + r * cos(360 * k / n), r * sin(360 * k / n), z0]],
                    [for (sx = [-1, 1], sy = [-1, 1]) [cx + sx * ax, sy * by, z1]]);
    hull() polyhedron(points = points, faces = [[for (k = [0 : n + 3]) k]]);
}

module outer_loft(i) {
    loft(bore_r + inset, fan_x[i], slot_hw(inset) + top_gap, in_by + top_gap, slot_cx(i, inset), plate_thickness, taper_length);
}
module inner_loft(i) {
    loft(bore_r, fan_x[i], slot_hw(inset), in_by, slot_cx(i, inset), plate_thickness,
         plate_thickness + inner_length);
    translate([fan_x[i], 0, -1]) cylinder(r = bore_r, h = plate_thickness + 1);
    // the lip's straight inner face: no knife edge where the card's end face rests
    translate([slot_cx(i, inset) - slot_hw(inset), -in_by, plate_thickness + inner_length])
        cube([2 * slot_hw(inset), 2 * in_by, stop_lip_height]);
}

module shroud() {
    difference() {
        union() {
            translate([-fan_count * fan_size / 2, -fan_size / 2, 0])
                cube([fan_count * fan_size, fan_size, plate_thickness]);
            for (i = [0 : fan_count - 1]) outer_loft(i);
            translate([-collar_ax, -collar_by, taper_length]) cube([2 * collar_ax, 2 * collar_by, collar_depth]);
        }
        for (i = [0 : fan_count - 1]) inner_loft(i);
        translate([-collar_ax + wall, -collar_by + wall, taper_length])
            cube([2 * (collar_ax - wall), 2 * (collar_by - wall), collar_depth + 1]);
        for (x = fan_x, sx = [-1, 1], sy = [-1, 1])
            translate([x + sx * screw_spacing / 2, sy * screw_spacing / 2, -1])
                cylinder(d = hole_d, h = plate_thickness + 2, $fn = 24);
    }
}

shroud();
