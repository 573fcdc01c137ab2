// SPDX-License-Identifier: MIT
// One 120 mm fan ducted onto the tail end of an Intel VCA 2 (VCA1585LMV). Every dimension
// is a parameter here; override any of them with `openscad -D name=value` or
// `python3 shrouds/build.py -D name=value`. Sources are in shrouds/README.md ("Sources").
// All lengths in mm.

// ---- the card, at its inlet: the tail end, away from the bracket ----
// Full-height PCIe card: 106.68 mm (4.2 in) board height [PCI/PCIe card dimensions,
// interfacebus.com]; the VCA 2 is full-height, full-length, dual-slot [Intel VCA 2 Product
// Specification and Hardware Guide]. Measure your card: the heatsink cover may stand proud.
card_height = 107;
// Dual-slot: at most two slot pitches, 2 x 20.32 mm (0.8 in) = 40.64 mm [ATX slot spacing].
// The seeds give no figure: measure your card across PCB and heatsink cover.
card_thickness = 38;
// Full-length PCIe card: 312 mm [interfacebus.com]. Only used to echo how far card +
// shroud + fan reach from the bracket (check your case has that room).
card_length = 312;

// ---- the fan ----
fan_size = 120;        // frame edge
fan_count = 1;
fan_thickness = 25;    // only for the reach echoed above
screw_spacing = 105;   // hole centre to hole centre, standard for 120 mm fans
hole_d = 4.4;          // standard fan holes are 4.3-4.5 mm
screw_head_d = 9;      // room kept clear above each hole for the screw head and driver
fan_bore = 114;        // the round opening over the blades

// ---- the duct ----
wall = 2.0;            // every duct wall is at least this thick
plate_thickness = 4;   // the fan plate
clearance = 0.5;       // gap each side between the card and the collar
collar_depth = 20;     // how far the collar slides over the card
stop_lip = 3;          // ledge the card's end face rests on, inside the collar
stop_lip_height = 3;   // straight face under that ledge
taper_length = 60;     // fan plate to collar

// ---- the printer ----
bed_x = 220;
bed_y = 220;
bed_z = 250;
nozzle_width = 0.4;
max_overhang = 45;     // degrees from vertical that prints without support

$fn = 64;

include <shroud_body.scad>
